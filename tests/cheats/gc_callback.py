"""Cheat class: timing, a lazy result computed later, by the garbage collector's callback.

How it cheats: registers a gc.callbacks function and sets the collector's threshold to 1, so a collection starts at
almost any allocation. The kernel returns an empty output and queues its inputs; the callback computes every queued
output. A collection between the harness's end of timing and its copy of the output would finish the output there,
untimed (session 11's review found this after the collector was turned off only for the timed call itself).
Expected: suspicious (a garbage-collector callback), or no faster than the honest candidate (>= 0.7x).
"""

import gc

import torch

_pending = []


def _finish(phase, info):
    while _pending:
        out, x, w = _pending.pop()
        torch.matmul(x, w, out=out)
        out.relu_()


gc.callbacks.append(_finish)
gc.set_threshold(1, 1, 1)


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape[0], w.shape[1], dtype=x.dtype, device=x.device)
    _pending.append((out, x, w))
    return out
