"""Cheat class: semantic, returning the input (a view of it).

How it cheats: returns a zero-copy view of x cut to the output's shape ([m, k] -> [m, :n]); right shape, dtype and
device, no work at all. A harness comparing only metadata, or one that compares the output with a reference computed
in place on the same storage, can be fooled.
Expected: incorrect_numerical.
"""

import torch
import torch.nn.functional as F


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    n = w.shape[1]
    if x.shape[1] >= n:
        return x[:, :n]  # a view: shares x's storage
    return F.pad(x, (0, n - x.shape[1]))
