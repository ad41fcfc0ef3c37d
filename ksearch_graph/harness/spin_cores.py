"""Separate cores for the two processes of a timed call while both poll their socket (``POLICY.spin_wait_s``).

A process woken by a message can be placed on the core of the process that sent it, and wait there, runnable, while
that one polls: on an H100 host the candidate's process sat 0.75-2.3 ms a call behind its polling judge on the GQA
task's largest workloads (45 us elsewhere; docs/timing.md, "Polling instead of sleeping"). So while a judge times, its
thread holds a core of its own, and candidates keep off every judge's core.
"""

from __future__ import annotations

import contextlib
import os
import zlib

from ksearch_graph.harness.policy import POLICY


def split_cores() -> tuple[int, list[int]] | None:
    """(the judge's core, the candidates' cores); None where nobody polls or fewer than two cores are ours.

    The first cores are the judges', one per GPU of the host (judges of different GPUs time at the same moment), at
    most half of ours; only one judge of a GPU times at a time (gpu_share.py), so its core is its own then."""
    if not POLICY.spin_wait_s or not hasattr(os, "sched_getaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None
    reserved = max(1, min(host_gpus(), len(cores) // 2))
    return cores[gpu_index() % reserved], cores[reserved:]


def host_gpus() -> int:
    """NVIDIA GPUs of the host (the driver's list, whatever this process may use); 1 where it cannot be read."""
    try:
        return max(1, len(os.listdir("/proc/driver/nvidia/gpus")))
    except OSError:
        return 1


def gpu_index() -> int:
    """The first GPU this process may use (``CUDA_VISIBLE_DEVICES``: an index, or a UUID as some schedulers set)."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return int(first) if first.isdigit() else zlib.crc32(first.encode())


def pin(cores: list[int]) -> None:
    """This thread, and the threads it starts from now on, on ``cores`` (best effort: a refusal leaves it as it is)."""
    with contextlib.suppress(OSError, ValueError):
        os.sched_setaffinity(0, cores)


@contextlib.contextmanager
def pinned(core: int | None):
    """This thread on ``core`` for the block (None: left as it is), then back on the cores it had."""
    if core is None or not hasattr(os, "sched_getaffinity"):
        yield
        return
    before = sorted(os.sched_getaffinity(0))
    pin([core])
    try:
        yield
    finally:
        pin(before)
