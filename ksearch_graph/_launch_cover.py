"""The launch cover: one kernel, run just before every timed call, that holds every SM of the GPU for a set time and
then writes the 256 MB flush buffer (flushing the L2).

Why (measured on an H200, BENCHMARKS.md session 7): after the host has waited (on the judge's pipe, or slept) or made
inputs on the CPU, launching the candidate's call takes it 130-230 us instead of ~40. The device idles between the
timed call's start event and its kernels meanwhile, and that idle counted: a 32 us matmul read 96-190 us. Back-to-back
use hides launches behind the previous call; this kernel does the same for a timed call. The host enqueues it, the
start event, the call and the end event, and has ``hold_s`` plus the flush to do so.

Why one kernel that fills every SM, and not a one-thread spin (``torch.cuda._sleep``): while a one-thread spin ran, a
candidate's work on another stream (tests/cheats/stream_switch.py, overlap_cover.py) ran beside it, before the start
event, and read 22 us against the honest 32. Here each SM holds as many of this kernel's threads as it can (1024 per
block, ``max_threads_per_multi_processor`` per SM), and its blocks only exit when the hold is over and their share of
the flush is written, so no other kernel can start a block until then, whatever its stream's priority. The flush comes
last, so nothing runs between it and the start event.

Standalone like ``_candidate_runner.py`` (stdlib, torch, triton: never ksearch_graph); imported only on CUDA.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

THREADS = 1024  # per block: num_warps=32
BLOCK = 4096  # int64 words one block writes per step (4 per thread)


@triton.jit
def _now():
    """The GPU's global nanosecond timer."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _hold_then_flush(words, n, per_block, hold_ns, BLOCK: tl.constexpr):
    t = _now()
    until = t + hold_ns
    while t < until:
        t = _now()
    first = tl.program_id(0).to(tl.int64) * per_block
    for step in range(0, per_block, BLOCK):
        at = first + step + tl.arange(0, BLOCK)
        tl.store(words + at, tl.zeros([BLOCK], dtype=tl.int64), mask=at < n)


class LaunchCover:
    """``cover()`` enqueues the kernel on the current stream. Built before any candidate code is imported; the first
    run (at construction) compiles it, or loads it from TRITON_CACHE_DIR, outside any timed call."""

    def __init__(self, flush: torch.Tensor, hold_s: float):
        props = torch.cuda.get_device_properties(flush.device)
        per_sm = getattr(props, "max_threads_per_multi_processor", 2048) // THREADS
        self.blocks = props.multi_processor_count * max(1, per_sm)
        self.words = flush.view(torch.int64)
        self.n = self.words.numel()
        self.per_block = -(-self.n // self.blocks)
        self.hold_ns = int(hold_s * 1e9)
        self.kernel = _hold_then_flush[(self.blocks,)]
        self()

    def __call__(self) -> None:
        self.kernel(self.words, self.n, self.per_block, self.hold_ns, BLOCK=BLOCK, num_warps=THREADS // 32)
