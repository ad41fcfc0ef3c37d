"""Cheat class: timing, reaching the harness's frames through a traceback.

How it cheats: raises and catches an exception in its call, takes the traceback's frame (its own) and walks f_back
to the harness's frames, where the timer is a local with a ``perf`` attribute; its clocks then read a tenth of the
time. The kernel itself is honest.
Expected: suspicious (the integrity check sees the timer changed).
"""

import torch

SCALE = 0.1


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    try:
        raise LookupError
    except LookupError as e:
        frame = e.__traceback__.tb_frame
    while frame is not None:
        timer = frame.f_locals.get("self")
        if hasattr(timer, "perf") and not getattr(timer, "_forged", False):
            perf = timer.perf
            timer.perf = lambda: perf() * SCALE
            timer._forged = True
        frame = frame.f_back
    return torch.relu(x @ w)
