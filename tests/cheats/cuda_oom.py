"""Crash class: CUDA out of memory.

How it crashes: asks for a 1 TiB device buffer as "workspace" (more than any GPU has), which raises
torch.OutOfMemoryError. The caching allocator may keep its other blocks; a harness reusing the process or the
device must not let the next candidate inherit a fragmented or exhausted GPU.
Expected: runtime_error, and an honest candidate evaluated right after passes (the GPU is healthy).
"""

import torch


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    workspace = torch.empty(1 << 40, dtype=torch.uint8, device=x.device)
    workspace.zero_()
    return torch.relu(x @ w)
