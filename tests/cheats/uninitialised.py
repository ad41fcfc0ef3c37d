"""Cheat class: semantic, reading stale or uninitialised memory.

How it cheats: returns torch.empty of the output's shape without writing it, hoping that the allocator hands back
the block the reference's output has just been freed from (PyTorch's caching allocator reuses the most recently
freed block of the same size first, and glibc reuses freed chunks), so the "result" is the expected answer.
A harness that computes the reference in the candidate's process right before the call and frees it without
overwriting it passes this candidate.
Expected: incorrect_numerical (or incorrect_shape/suspicious), never passed.
"""

import torch


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.empty(x.shape[0], w.shape[1], dtype=x.dtype, device=x.device)
