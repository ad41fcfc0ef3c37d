"""Crash class: raising KeyboardInterrupt inside the kernel.

How it crashes: raises KeyboardInterrupt (a BaseException, not an Exception) from its first call, as if the user had
pressed Ctrl-C: a harness that catches Exception only, or treats KeyboardInterrupt as its own cancellation, can die
or stop the whole search instead of failing this candidate.
Expected: runtime_error (and the evaluator itself does not raise).
"""

import torch


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    raise KeyboardInterrupt
    return torch.relu(x @ w)  # unreachable
