"""Separate cores for the two processes of a timed call while both poll their socket (``POLICY.spin_wait_s``).

A process woken by a message can be placed on the core of the process that sent it, and wait there, runnable, while
that one polls: on an H100 host the candidate's process sat 1.2-3.7 ms a call behind its polling judge on the GQA
task's largest workloads (40-50 us elsewhere; docs/timing.md, "Polling instead of sleeping"). So the judge's thread
keeps one core and the candidate's process the others.
"""

from __future__ import annotations

import contextlib
import os

from ksearch_graph.harness.policy import POLICY


def split_cores() -> tuple[int, list[int]] | None:
    """(the judge's core, the candidate's cores); None where nobody polls or fewer than two cores are ours."""
    if not POLICY.spin_wait_s or not hasattr(os, "sched_getaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None
    judge = cores[os.getpid() % len(cores)]  # the judges of a pool's lanes spread over the host's cores
    return judge, [c for c in cores if c != judge]


def pin(cores: list[int]) -> None:
    """This thread, and the threads it starts from now on, on ``cores`` (best effort: a refusal leaves it as it is)."""
    with contextlib.suppress(OSError, ValueError):
        os.sched_setaffinity(0, cores)
