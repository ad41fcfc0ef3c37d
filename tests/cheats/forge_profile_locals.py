"""Cheat class: timing, forging the clock reads of the call it is in, through a profile function.

How it cheats: in a timed call (a frame up the stack, reached through f_back, holds the timer's ``perf``), it sets a
profile function (sys.setprofile) and returns. The timer's frame then calls
a C function (the collector switch, the event record): the profile function is called with that frame, rewrites its
locals (CPython writes a profile function's f_locals back into the frame), the start of the host clock (CPU) or the
bound event reader (GPU), so that this call reads a tenth of its time, and removes itself before the harness looks
for profile functions. Nothing of the harness's objects is rebound; the kernel itself is honest.
Expected: suspicious (the audit hook blocks sys.setprofile from candidate code).
"""

import sys

import torch

SCALE = 0.1


def _rewrite(frame, event, arg):
    if event != "c_call":
        return
    names = frame.f_locals
    if "perf" not in names:
        return
    if "t0" in names and "h0" not in names:  # the CPU branch: the clock's start moves up
        perf = names["perf"]
        names["t0"] = names["t0"] + (perf() - names["t0"]) * (1 - SCALE)
    elif "elapsed" in names:
        real = names["elapsed"]
        names["elapsed"] = lambda a, b: real(a, b) * SCALE
    sys.setprofile(None)


def _timed() -> bool:
    frame = sys._getframe(1).f_back
    while frame is not None and "perf" not in frame.f_locals:
        frame = frame.f_back
    return frame is not None


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    out = torch.relu(x @ w)
    if _timed():
        sys.setprofile(_rewrite)
    return out
