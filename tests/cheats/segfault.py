"""Crash class: a segmentation fault.

How it crashes: reads address 0 through ctypes (ctypes.string_at(0)) on its second call, after one honest call, so
the process dies from SIGSEGV in the middle of the evaluation, with no Python exception to catch.
Expected: runtime_error (the harness survives and names the signal), never passed.
"""

import ctypes

import torch

_calls = 0


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    global _calls
    _calls += 1
    if _calls >= 2:
        ctypes.string_at(0)
    return torch.relu(x @ w)
