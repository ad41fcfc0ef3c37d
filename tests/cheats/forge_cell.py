"""Cheat class: timing, editing closure cells of the harness's functions (no attribute is rebound).

How it cheats: walks up from its own frame to the harness's, and in every function the timer or the runner's module
holds, replaces each closure cell that holds a callable by a wrapper (a cell's contents can be set without any audit
event). On a GPU the timer's ``record`` closure holds the functions that record the call's events; a wrapper there
could record them anywhere. Here the wrappers pass calls through, so what is tested is that the change is seen.
Expected: suspicious (the integrity check compares every watched function's cells).
"""

import sys
import types

import torch

_done = set()


def _wrap(fn):
    return lambda *a, **k: fn(*a, **k)


def _edit(fn):
    fn = getattr(fn, "__func__", fn)
    if not isinstance(fn, types.FunctionType) or id(fn) in _done:
        return
    _done.add(id(fn))
    for cell in fn.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if callable(value) and not isinstance(value, type):
            cell.cell_contents = _wrap(value)


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    frame = sys._getframe(0)
    while frame is not None:
        for value in list(frame.f_locals.values()):
            if hasattr(value, "perf"):  # the timer
                for attr in list(vars(value).values()):
                    _edit(attr)
        for value in list(frame.f_globals.values()):
            if isinstance(value, type) and value.__module__ == frame.f_globals.get("__name__"):
                for attr in list(vars(value).values()):
                    _edit(attr)
        frame = frame.f_back
    return torch.relu(x @ w)
