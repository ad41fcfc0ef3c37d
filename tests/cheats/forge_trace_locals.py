"""Cheat class: timing, forging the clock reads of the call it is in, through a trace function on the timer's frame.

How it cheats: in every call, sys._getframe(0) (its own frame: allowed), then f_back (no audit event) to the frame
that times it; it sets that frame's f_trace and turns tracing on with sys.settrace. When the timer's frame runs its
next line, the trace function rewrites the frame's locals (CPython writes a trace function's f_locals back into the
frame): the start of the host clock (CPU) or the bound event reader (GPU), so that this call reads a tenth of its time.
It then turns tracing off and clears f_trace, before the harness looks for trace functions. Nothing of the harness's
objects is rebound; the kernel itself is honest.
Expected: suspicious (the audit hook blocks sys.settrace from candidate code).
"""

import sys

import torch

SCALE = 0.1


def _rewrite(frame, event, arg):
    names = frame.f_locals
    if "t0" in names and "perf" in names and "h0" not in names:  # the CPU branch: the clock's start moves up
        perf = names["perf"]
        names["t0"] = names["t0"] + (perf() - names["t0"]) * (1 - SCALE)
    elif "elapsed" in names and not getattr(names["elapsed"], "_forged", False):
        real = names["elapsed"]
        forged = lambda a, b: real(a, b) * SCALE  # noqa: E731
        forged._forged = True
        names["elapsed"] = forged
    sys.settrace(None)
    frame.f_trace = None
    return None


def _arm():
    frame = sys._getframe(0).f_back
    while frame is not None and "perf" not in frame.f_locals:
        frame = frame.f_back
    if frame is not None:
        frame.f_trace = _rewrite
        sys.settrace(lambda *a: None)  # tracing on for this thread; the frame's own f_trace does the work


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    out = torch.relu(x @ w)
    _arm()
    return out
