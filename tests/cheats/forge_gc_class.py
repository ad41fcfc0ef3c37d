"""Cheat class: timing, forging the harness's own timer found by its class through the garbage collector.

How it cheats: at import and in every call it scans gc.get_objects() for an object with a ``perf`` and an
``elapsed`` attribute (the runner's timer, found by shape, not by name) and makes both read a tenth of the real
time. The kernel itself is honest.
Expected: suspicious (the audit hook blocks gc.get_objects and names it).
"""

import gc

import torch

SCALE = 0.1


def _forge():
    for obj in gc.get_objects():
        if hasattr(obj, "perf") and hasattr(obj, "elapsed") and not getattr(obj, "_forged", False):
            perf, elapsed = obj.perf, obj.elapsed
            obj.perf = lambda: perf() * SCALE
            if elapsed is not None:
                obj.elapsed = lambda a, b: elapsed(a, b) * SCALE
            obj._forged = True


try:
    _forge()
except Exception:  # a blocked search: try again in the call
    pass


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    try:
        _forge()
    except Exception:
        pass
    return torch.relu(x @ w)
