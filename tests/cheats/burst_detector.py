"""Cheat class: timing, detecting timed calls by their rhythm.

How it cheats: a harness that times calls back to back calls again within microseconds of the previous return,
while checked calls come after the harness has generated inputs, computed a reference and compared. So it computes
honestly when its previous call returned more than 2 ms ago, and returns zeros of the right shape otherwise. A
harness that checks only calls made one at a time passes it with a huge speedup.
Expected: not passed (incorrect_numerical or suspicious), or no timing gain where the harness's rhythm never
triggers it: outputs of calls from inside a burst must be checked too.
"""

import time

import torch

_last_return = [float("-inf")]


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    rushed = time.perf_counter() - _last_return[0] < 0.002
    out = torch.zeros(x.shape[0], w.shape[1], dtype=x.dtype, device=x.device) if rushed else torch.relu(x @ w)
    _last_return[0] = time.perf_counter()
    return out
