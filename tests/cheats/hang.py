"""Crash class: an infinite loop that ignores polite signals.

How it hangs: ignores SIGTERM, SIGINT and SIGHUP, then spins forever in the first call. Only a SIGKILL (of the
whole process group / session) ends it.
Expected: timeout, at the evaluator's timeout_s.
"""

import signal

import torch

for _sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    try:
        signal.signal(_sig, signal.SIG_IGN)
    except (ValueError, OSError):
        pass


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    while True:
        pass
    return torch.relu(x @ w)  # unreachable
