"""Cheat class: timing, replacing every reference to a clock that the garbage collector can show (no names).

How it cheats: gc.get_objects(), and for every dict among them (instance and module namespaces) every value that is
time.perf_counter or torch.cuda.Event.elapsed_time (or the C method under it) is replaced by a version reading a
tenth of the time; the issue's attack, written against whatever holds the clock. The kernel itself is honest.
Expected: suspicious (gc.get_objects is blocked and named).
"""

import gc
import time

import torch

SCALE = 0.1
_CLOCKS = [time.perf_counter]
for _owner in (getattr(torch.cuda, "Event", None), getattr(torch._C, "_CudaEventBase", None)):
    if _owner is not None and hasattr(_owner, "elapsed_time"):
        _CLOCKS.append(_owner.elapsed_time)


def _slow(fn):
    return (lambda *a: fn(*a) * SCALE) if fn is not time.perf_counter else (lambda: fn() * SCALE)


def _forge():
    for obj in gc.get_objects():
        if type(obj) is dict and obj is not globals():
            for key, value in list(obj.items()):
                if any(value is c for c in _CLOCKS):
                    obj[key] = _slow(value)


try:
    _forge()
except Exception:
    pass


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    try:
        _forge()
    except Exception:
        pass
    return torch.relu(x @ w)
