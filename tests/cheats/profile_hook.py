"""Cheat class: timing, a lazy result computed later, by a profile function.

How it cheats: the kernel returns an empty output and installs a sys.setprofile function; it waits out the calls that
follow the kernel's return (the end of timing: events, synchronize) and computes the output at the first call of a
function whose name says it copies or checks: a harness that copies the output after its timer stopped gets the
right answer, untimed. On later calls the same happens again.
Expected: suspicious (a profile function), or no faster than the honest candidate (>= 0.7x).
"""

import sys

import torch

_pending = []
_COPIERS = ("snapshot", "clone", "copy", "fingerprint", "detach", "time_and_copy")


def _hook(frame, event, arg):
    name = getattr(arg, "__name__", "") if event == "c_call" else frame.f_code.co_name
    if _pending and event in ("call", "c_call") and any(c in name for c in _COPIERS):
        sys.setprofile(None)  # not while computing
        while _pending:
            out, x, w = _pending.pop()
            torch.matmul(x, w, out=out)
            out.relu_()
        sys.setprofile(_hook)


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape[0], w.shape[1], dtype=x.dtype, device=x.device)
    _pending.append((out, x, w))
    sys.setprofile(_hook)
    return out
