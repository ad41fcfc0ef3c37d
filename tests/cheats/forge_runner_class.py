"""Cheat class: timing, replacing the runner's own method through its module (no search needed).

How it cheats: the runner is the process's __main__ module: at import it wraps the timer class's ``time_call`` so every
timed call reports a tenth of its device and host time. The kernel itself is honest.
Expected: suspicious (the integrity check sees the class attribute replaced).
"""

import sys

import torch

SCALE = 0.1
_runner = sys.modules["__main__"]
_Timer = getattr(_runner, "Timer", None)
if _Timer is not None:
    _real = _Timer.time_call

    def _time(self, fn, args):
        out, device, tail, host, launch = _real(self, fn, args)
        return out, device * SCALE, tail, host * SCALE, launch * SCALE

    _Timer.time_call = _time


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ w)
