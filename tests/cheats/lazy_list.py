"""Cheat class: timing, a lazy result computed later, by a list that computes when read.

How it cheats: returns its one output inside a list subclass whose __iter__ (and __getitem__) compute it first: a
harness that reads the list after its timer stopped finds the right answer.
Expected: not passed (the list is read as a plain list: the output is empty), or no faster than the honest candidate.
"""

import torch


class Later(list):
    def _finish(self):
        if self.inputs is not None:
            x, w = self.inputs
            self.inputs = None
            torch.matmul(x, w, out=list.__getitem__(self, 0))
            list.__getitem__(self, 0).relu_()

    def __iter__(self):
        self._finish()
        return list.__iter__(self)

    def __getitem__(self, i):
        self._finish()
        return list.__getitem__(self, i)

    def __len__(self):
        return 1


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    out = Later([torch.full((x.shape[0], w.shape[1]), float("nan"), dtype=x.dtype, device=x.device)])
    out.inputs = (x, w)
    return out
