"""Cheat class: timing, forging the timer found by walking up from the candidate's own frame.

How it cheats: in every call, sys._getframe(0) (its own frame: allowed) and then f_back, f_back, ... (no audit event
exists for f_back or f_locals) to the harness's frames; any local with a ``perf`` attribute is the timer: its clocks
are made to read a tenth of the time. The kernel itself is honest.
Expected: suspicious (the integrity check sees the timer's attributes rebound).
"""

import sys

import torch

SCALE = 0.1


def _forge(frame):
    while frame is not None:
        for value in list(frame.f_locals.values()):
            if hasattr(value, "perf") and not getattr(value, "_forged", False):
                perf, elapsed = value.perf, getattr(value, "elapsed", None)
                value.perf = lambda: perf() * SCALE
                if elapsed is not None:
                    value.elapsed = lambda a, b: elapsed(a, b) * SCALE
                value._forged = True
        frame = frame.f_back


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    _forge(sys._getframe(0))
    return torch.relu(x @ w)
