"""Cheat class: timing, the answer computed while the harness makes the inputs, through a patched torch function.

How it cheats: the harness makes each call's inputs in the candidate's process with the task's make_inputs, which
ends with ``x.contiguous().to(device), w.contiguous().to(device)``. At import this candidate replaces
torch.Tensor.to with a version that, once it has seen an x and then a w that fit together, computes relu(x @ w)
right there (untimed: no timer runs while inputs are made) and keeps it under the inputs' addresses. The kernel
returns the kept answer when there is one, and computes it honestly otherwise (so warm-up and repeated calls on
the same inputs are correct too).
Expected: suspicious (the harness names torch functions the candidate replaced), or no faster than the honest
candidate.
"""

import torch

_to = torch.Tensor.to
_seen: list = []
_answers: dict = {}


def to(self, *args, **kwargs):
    out = _to(self, *args, **kwargs)
    _seen[:] = _seen[-1:] + [out]
    if len(_seen) == 2:
        x, w = _seen
        if x.dim() == 2 and w.dim() == 2 and x.shape[1] == w.shape[0] and x.dtype == w.dtype == torch.float32:
            _answers[(x.data_ptr(), w.data_ptr())] = torch.relu(x @ w)
    return out


torch.Tensor.to = to


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    kept = _answers.get((x.data_ptr(), w.data_ptr()))
    if kept is not None and kept.shape == (x.shape[0], w.shape[1]):
        return kept
    return torch.relu(x @ w)
