"""Cheat class: semantic, returning zeros.

How it cheats: "relu zeroes about half of the outputs anyway", so it skips the matmul and returns an all-zero tensor
of the right shape, dtype and device, which costs one memset. A harness that checks only shape and dtype, or whose
tolerance is loose relative to the output's magnitude, passes it with a huge speedup.
Expected: incorrect_numerical (half the reference outputs are clearly positive).
"""

import torch


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.zeros(x.shape[0], w.shape[1], dtype=x.dtype, device=x.device)
