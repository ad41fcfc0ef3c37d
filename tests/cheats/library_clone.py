"""Cheat class: timing, a lazy result computed later, by a Python kernel for aten::clone.

How it cheats: registers its own kernel for aten::clone (torch.library, the Autograd keys), which a harness's copy of
the output runs however it bound torch.Tensor.clone; the kernel finishes the pending output first, untimed.
Expected: suspicious (a Python kernel for an operator that copies tensors), or no faster than the honest candidate.
"""

import torch

_pending = []


def _finish():
    while _pending:
        out, x, w = _pending.pop()
        torch.matmul(x, w, out=out)
        out.relu_()


def _clone(t, *args, **kwargs):
    _finish()
    with torch._C._AutoDispatchBelowAutograd():
        return torch.ops.aten.clone.default(t, *args, **kwargs)


_lib = torch.library.Library("aten", "IMPL")
for _key in ("AutogradCPU", "AutogradCUDA"):
    _lib.impl("clone", _clone, _key)


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    out = torch.full((x.shape[0], w.shape[1]), float("nan"), dtype=x.dtype, device=x.device)
    _pending.append((out, x, w))
    return out
