"""Crash class: raising SystemExit inside the kernel.

How it crashes: calls sys.exit(0) in its first call, hoping the harness catches only Exception (SystemExit is a
BaseException) so that the process exits with status 0, or that an exit code of 0 is read as success.
Expected: runtime_error.
"""

import sys

import torch


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    sys.exit(0)
    return torch.relu(x @ w)  # unreachable
