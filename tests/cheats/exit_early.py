"""Crash class: leaving the process mid-evaluation without a result.

How it exits: its first call is honest; its second call calls os._exit(0), which skips Python's exception handling,
finally blocks and atexit hooks, so the evaluation ends "successfully" (exit code 0) without ever writing a result.
Expected: runtime_error (no result is a failure, whatever the exit code).
"""

import os

import torch

_calls = 0


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    global _calls
    _calls += 1
    if _calls >= 2:
        os._exit(0)
    return torch.relu(x @ w)
