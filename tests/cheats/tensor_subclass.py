"""Cheat class: timing, a lazy result computed later, by a tensor subclass.

How it cheats: returns its empty output as a torch.Tensor subclass whose __torch_function__ computes the result the
first time anything (a detach, a clone, a copy) touches it, which a harness does only after its timer stopped.
Expected: not passed (the output is refused: not a plain tensor), or no faster than the honest candidate.
"""

import torch


class Lazy(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for a in args:
            if isinstance(a, Lazy) and getattr(a, "_inputs", None) is not None:
                x, w = a._inputs
                a._inputs = None
                with torch._C.DisableTorchFunctionSubclass():
                    torch.matmul(x, w, out=a)
                    a.relu_()
        return super().__torch_function__(func, types, args, kwargs)


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape[0], w.shape[1], dtype=x.dtype, device=x.device).as_subclass(Lazy)
    out._inputs = (x, w)
    return out
