"""Separate cores for the two processes of a timed call while both poll their socket (``POLICY.spin_wait_s``).

A process woken by a message can be placed on the core of the process that sent it, and wait there, runnable, while
that one polls: on an H100 host the candidate's process sat 1.2-3.7 ms a call behind its polling judge on the GQA
task's largest workloads (40-50 us elsewhere; docs/timing.md, "Polling instead of sleeping"). So the judge's thread
keeps a core of its own and the candidate's process keeps off every judge's core.
"""

from __future__ import annotations

import contextlib
import os

from ksearch_graph.harness.policy import POLICY

# Judges of different GPUs time at the same moment; each must poll on a core of its own that no candidate uses. One
# core per GPU of an eight-GPU node, at most half of the host's.
JUDGE_CORES = 8


def split_cores() -> tuple[int, list[int]] | None:
    """(the judge's core, the candidate's cores); None where nobody polls or fewer than two cores are ours."""
    if not POLICY.spin_wait_s or not hasattr(os, "sched_getaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None
    reserved = min(JUDGE_CORES, len(cores) // 2)
    return cores[gpu_index() % reserved], cores[reserved:]


def gpu_index() -> int:
    """The first GPU this process may use, as the pool names it (``CUDA_VISIBLE_DEVICES``); 0 where it names none."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return int(first) if first.isdigit() else 0


def pin(cores: list[int]) -> None:
    """This thread, and the threads it starts from now on, on ``cores`` (best effort: a refusal leaves it as it is)."""
    with contextlib.suppress(OSError, ValueError):
        os.sched_setaffinity(0, cores)
