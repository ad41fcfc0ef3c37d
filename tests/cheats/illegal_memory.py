"""Crash class: an illegal memory access on the GPU (a poisoned CUDA context).

How it crashes: a Triton kernel with an unmasked store far outside its output buffer (a classic missing-mask or
wrong-stride bug, here deliberate) raises "an illegal memory access was encountered"; after it, every CUDA call in
that process fails. A harness that keeps a worker process (or a CUDA context) alive across candidates must detect
this and restart; one that does not reports later, innocent candidates as failures.
Expected: runtime_error, and an honest candidate evaluated right after passes (the GPU is healthy).
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _bad_store(out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    far = out_ptr + offs + (1 << 40)  # 4 TB past the buffer, never mapped
    tl.store(far, tl.zeros([BLOCK], dtype=tl.float32))


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    out = torch.relu(x @ w)
    _bad_store[(1,)](out, out.numel(), BLOCK=128)
    return out
