"""Cheat class: timing, a lazy result computed later, by a patched torch.Tensor.clone.

How it cheats: replaces torch.Tensor.clone (and detach) at import with versions that first finish the pending
outputs; the kernel returns an unfinished output (NaN), so a harness that copies outputs through torch.Tensor.clone
after its timer stopped finishes it, untimed.
Expected: not passed (the harness copies with the clone it bound before the candidate was imported: the output is
NaN), or no faster than the honest candidate.
"""

import torch

_pending = []
_clone, _detach = torch.Tensor.clone, torch.Tensor.detach


def _finish():
    while _pending:
        out, x, w = _pending.pop()
        torch.matmul(x, w, out=out)
        out.relu_()


def clone(self, *args, **kwargs):
    _finish()
    return _clone(self, *args, **kwargs)


def detach(self):
    _finish()
    return _detach(self)


torch.Tensor.clone, torch.Tensor.detach = clone, detach


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    out = torch.full((x.shape[0], w.shape[1]), float("nan"), dtype=x.dtype, device=x.device)
    _pending.append((out, x, w))
    return out
