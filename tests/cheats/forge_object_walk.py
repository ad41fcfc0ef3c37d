"""Cheat class: timing, finding every holder of the clock by walking the object graph without the collector.

How it cheats: from every module in sys.modules and from its callers' frames (f_back: no audit event), it follows
__dict__s, lists, tuples, dicts and closure cells a few levels deep, and replaces every reference to
time.perf_counter or an event's elapsed_time it finds (no names: the issue's attack with gc.get_objects blocked).
The kernel itself is honest.
Expected: suspicious (sys._getframe(1) returns a frame of the harness: blocked; reached through f_back instead, the
integrity check would see the clock rebound).
"""

import sys
import time
import types

import torch

SCALE = 0.1
_CLOCKS = [time.perf_counter]
for _owner in (getattr(torch.cuda, "Event", None), getattr(torch._C, "_CudaEventBase", None)):
    if _owner is not None and hasattr(_owner, "elapsed_time"):
        _CLOCKS.append(_owner.elapsed_time)


def _slow(fn):
    return (lambda: fn() * SCALE) if fn is time.perf_counter else (lambda *a: fn(*a) * SCALE)


def _namespace(obj):
    if isinstance(obj, dict):
        return obj
    d = getattr(obj, "__dict__", None) if not isinstance(obj, type) else None
    return d if isinstance(d, dict) else None


def _walk(roots, depth=4):
    seen, layer = set(), list(roots)
    for _ in range(depth):
        nxt = []
        for obj in layer:
            if id(obj) in seen or isinstance(obj, (str, bytes, int, float, torch.Tensor)):
                continue
            seen.add(id(obj))
            space = _namespace(obj)
            if space is not None and space is not globals():
                for key, value in list(space.items()):
                    if any(value is c for c in _CLOCKS):
                        space[key] = _slow(value)
                    else:
                        nxt.append(value)
            elif isinstance(obj, (list, tuple)):
                nxt.extend(obj)
            elif isinstance(obj, types.FunctionType):
                nxt.extend(c.cell_contents for c in obj.__closure__ or () if c.cell_contents is not None)
        layer = nxt


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    roots, frame = [], sys._getframe(1)
    while frame is not None:
        roots.append(dict(frame.f_locals))
        frame = frame.f_back
    _walk(roots)
    return torch.relu(x @ w)
