"""Cheat class: timing, a lazy result computed later, by the garbage collector turned back on.

How it cheats: the harness keeps the collector off from the timed call to the copy of its output; the kernel turns
it back on with a threshold of 1 and leaves a reference cycle whose __del__ finishes the output, so the first
allocation after the call (the end of timing, the copy) collects it, untimed.
Expected: not passed (the collector is off again right after the call: the output stays NaN), or no faster than the
honest candidate.
"""

import gc

import torch

_pending = []


def _finish():
    while _pending:
        out, x, w = _pending.pop()
        torch.matmul(x, w, out=out)
        out.relu_()


class _Cycle:
    def __init__(self):
        self.me = self  # only the collector frees it

    def __del__(self):
        _finish()


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    out = torch.full((x.shape[0], w.shape[1]), float("nan"), dtype=x.dtype, device=x.device)
    _pending.append((out, x, w))
    _Cycle()
    gc.set_threshold(1)
    gc.enable()
    return out
