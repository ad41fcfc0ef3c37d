"""Cheat class: timing, a lazy result computed later, by a profile function set from C.

How it cheats: installs a profile function through ctypes (PyEval_SetProfile with no object), which
sys.getprofile() does not show, and finishes its output at the first Python call after the kernel's return whose
name says it copies (the harness's snapshot).
Expected: not passed (the profile function is reset right after the call: the output stays NaN), or no faster than
the honest candidate.
"""

import ctypes

import torch

_pending = []
_PROFILE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)
_CALL = 0  # PyTrace_CALL


def _profile(obj, frame, what, arg):
    if what == _CALL and _pending and "snapshot" in ctypes.cast(frame, ctypes.py_object).value.f_code.co_name:
        while _pending:
            out, x, w = _pending.pop()
            torch.matmul(x, w, out=out)
            out.relu_()
    return 0


_callback = _PROFILE(_profile)
ctypes.pythonapi.PyEval_SetProfile.argtypes = [_PROFILE, ctypes.c_void_p]


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    out = torch.full((x.shape[0], w.shape[1]), float("nan"), dtype=x.dtype, device=x.device)
    _pending.append((out, x, w))
    ctypes.pythonapi.PyEval_SetProfile(_callback, None)
    return out
