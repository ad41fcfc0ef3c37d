"""Cheat class: timing, a thread that patches the timer's clock and puts it back between the harness's checks.

How it cheats: its first call finds the timer (walking up from its own frame) and starts a thread that, in a loop,
sets the timer's clock to one that reads a tenth of the time and restores the real one 50 us later: a check that
happens to run while the real one is in place sees nothing. The kernel itself is honest.
Expected: suspicious (the timer binds its clock and is checked right before each timed call: a patch in place then
is found, one put back before it times nothing).
"""

import sys
import threading
import time

import torch

SCALE = 0.1
_started = []


def _flicker(timer):
    real = timer.perf
    fake = lambda: real() * SCALE  # noqa: E731
    until = real() + 60
    while real() < until:
        timer.perf = fake
        time.sleep(0.0002)
        timer.perf = real
        time.sleep(0.00005)


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    if not _started:
        frame = sys._getframe(0)
        while frame is not None:
            timer = frame.f_locals.get("self")
            if hasattr(timer, "perf") and hasattr(timer, "heat"):
                threading.Thread(target=_flicker, args=(timer,), daemon=True).start()
                _started.append(timer)
                break
            frame = frame.f_back
    return torch.relu(x @ w)
