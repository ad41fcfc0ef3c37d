"""Cheat class: semantic, lower precision than the task allows.

How it cheats: casts both inputs to float16 ("tensor cores are 16x faster"), multiplies, and casts the result back
to float32, so shape and dtype are right and the answer is close, but each product carries ~5e-4 relative error and
the output is rounded to fp16. The task's tolerance (atol = rtol = 1e-4, outputs of O(1) to O(10)) does not allow it.
Expected: incorrect_numerical.
"""

import torch


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.relu(x.half() @ w.half()).float()
