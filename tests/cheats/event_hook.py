"""Cheat class: timing, a lazy result computed later, by Python's event hooks: a sys.monitoring tool where Python has
them (3.12+), else a trace function (sys.settrace).

How it cheats: like profile_hook.py, through the other hook: the output is computed at the first Python function
that starts after the kernel's return and whose name says it copies or checks.
Expected: suspicious (a sys.monitoring tool or a trace function), or no faster than the honest candidate (>= 0.7x).
"""

import sys

import torch

_pending = []
_COPIERS = ("snapshot", "copy", "fingerprint")


def _finish():
    while _pending:
        out, x, w = _pending.pop()
        torch.matmul(x, w, out=out)
        out.relu_()


if hasattr(sys, "monitoring"):
    _TOOL = 4
    sys.monitoring.use_tool_id(_TOOL, "lazy")

    def _start(code, offset):
        if _pending and any(c in code.co_name for c in _COPIERS):
            _finish()

    sys.monitoring.register_callback(_TOOL, sys.monitoring.events.PY_START, _start)

    def _arm():
        sys.monitoring.set_events(_TOOL, sys.monitoring.events.PY_START)
else:
    def _trace(frame, event, arg):
        if event == "call" and _pending and any(c in frame.f_code.co_name for c in _COPIERS):
            _finish()
        return None

    def _arm():
        sys.settrace(_trace)


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape[0], w.shape[1], dtype=x.dtype, device=x.device)
    _pending.append((out, x, w))
    _arm()
    return out
