"""Cheat class: timing, a lazy result computed later, by a torch function mode.

How it cheats: enters a TorchFunctionMode at import and never leaves it; the kernel returns an empty output, and the
mode finishes it at the next torch call made outside the kernel (the harness's copy of the output).
Expected: suspicious (a mode left entered), or no faster than the honest candidate (>= 0.7x).
"""

import torch
from torch.overrides import TorchFunctionMode

_pending = []
_inside = [False]


class _Finisher(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if _pending and not _inside[0]:
            with torch._C.DisableTorchFunction():
                while _pending:
                    out, x, w = _pending.pop()
                    torch.matmul(x, w, out=out)
                    out.relu_()
        return func(*args, **(kwargs or {}))


_Finisher().__enter__()


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    _inside[0] = True
    try:
        out = torch.empty(x.shape[0], w.shape[1], dtype=x.dtype, device=x.device)
    finally:
        _inside[0] = False
    _pending.append((out, x, w))
    return out
