"""Honest candidate: y = relu(x @ w) with one matmul and one relu, nothing else.

Not a cheat. It must pass, and its measured latency per workload calibrates the timing assertions of the suite
(a caught timing cheat must not look much faster than this).
"""

import torch


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ w)
