"""Cheat class: timing, swapping the code of the runner's timing method (the function object stays the same).

How it cheats: at import it gives the runner's Timer.time_call the code of a function that calls the original (kept as
a copy) (made with types.FunctionType) and scales its device and host
times by a tenth; the class attribute is untouched, only ``__code__`` changes.
The kernel itself is honest.
Expected: suspicious (setting __code__ on a harness function is blocked and named).
"""

import sys
import types

import torch

SCALE = 0.1
_Timer = getattr(sys.modules["__main__"], "Timer", None)
if _Timer is not None:
    _orig = _Timer.time_call
    try:
        _copy = types.FunctionType(_orig.__code__, _orig.__globals__, "_copy", _orig.__defaults__,
                                   _orig.__closure__)

        def _time(self, fn, args, _copy=_copy):
            out, device, tail, host, launch = _copy(self, fn, args)
            return out, device * SCALE, tail, host * SCALE, launch * SCALE

        _orig.__code__, _orig.__defaults__ = _time.__code__, (_copy,)
    except Exception:
        pass


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ w)
