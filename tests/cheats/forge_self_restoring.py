"""Cheat class: timing, a clock that puts itself back (invented: no thread, no race).

How it cheats: in a call (on a GPU also the heat's untimed calls, run back to back before a burst) it finds the timer
by walking up from its own frame and replaces its clock with one that reads a tenth of the time for two readings (the
next timed call) and then restores the real clock itself, so a check after that call sees the original.
The kernel itself is honest.
Expected: suspicious (the timer checks its own state right before each timed call, after binding what it calls).
"""

import sys

import torch

SCALE = 0.1


def _install(timer):
    real = timer.perf
    left = [2]

    def fake():
        left[0] -= 1
        if left[0] <= 0:
            timer.perf = real
        return real() * SCALE

    timer.perf = fake


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    frame = sys._getframe(0)
    while frame is not None:
        timer = frame.f_locals.get("self")
        if hasattr(timer, "perf") and hasattr(timer, "heat"):
            if getattr(timer.perf, "__name__", "") != "fake":
                _install(timer)
            break
        frame = frame.f_back
    return torch.relu(x @ w)
