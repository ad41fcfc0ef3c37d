"""Cheat class: timing, detecting warm-up / correctness calls vs. timed calls.

How it cheats: benchmarks check a few calls first and time the rest, so it counts its calls: the first HONEST_CALLS
(enough for a couple of correctness sets per workload and a warm-up) compute honestly; every later call skips the
matmul and returns zeros of the right shape. A harness that only checks the output of its correctness calls passes
it with a huge speedup.
Expected: not passed (incorrect_numerical or suspicious): the timed calls' outputs must be checked too.
"""

import torch

HONEST_CALLS = 8
_calls = 0


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    global _calls
    _calls += 1
    if _calls <= HONEST_CALLS:
        return torch.relu(x @ w)
    return torch.zeros(x.shape[0], w.shape[1], dtype=x.dtype, device=x.device)
