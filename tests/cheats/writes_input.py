"""Cheat class: semantic, writing into the inputs.

How it cheats: computes the right answer, then "saves an allocation" by storing it in the weight tensor's storage
(w has k * n >= m * n elements here) and returns a view of w. The values it returns are correct, but its inputs are
destroyed: a harness that reuses inputs across calls, or computes the reference afterwards on the same tensors,
is corrupted (and an in-place output can make a later comparison trivially true).
Expected: suspicious (the harness must compare inputs with pristine copies after the call).
"""

import torch


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = torch.relu(x @ w)
    for scratch in (w, x):
        if scratch.numel() >= y.numel():
            out = scratch.view(-1)[: y.numel()].view(y.shape)
            out.copy_(y)
            return out
    x.zero_()  # inputs too small to reuse: clobber one anyway
    return y
