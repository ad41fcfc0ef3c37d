"""How evaluations on one host share a device: timing alone, checking side by side, the rest free.

Several evaluations may run on one GPU at once (a pool's lanes, docs/scale-out.md). Every step of an evaluation that
touches the device holds it: making the two processes' contexts and timers (the candidate's process imports torch
first and touches the device only when told), importing the candidate, correctness checks (inputs, the reference,
the candidate's calls, the comparison) and stopping the candidate's process take a *shared* hold, so those of several
evaluations run together; torch imports and waiting for a job hold nothing. Timing (the reference's, the candidate's, the
clock's calibration) takes an *exclusive* hold: while a call is timed no other evaluation's judge or candidate call
runs on that device. A turnstile keeps a waiting timer from being starved by a stream of checks: a timer takes it
before it waits for the checks in progress to end, and every check passes through it before it starts.

The holds are ``flock`` locks on files named by the device's UUID, so every judge of the host meets the same ones,
whichever user or pool started it, and a killed holder's lock is dropped by the kernel. Each hold is recorded as a
span (what, wall-clock start and end) so a run can say how busy its GPU was (tools/gpu_pool_run.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time

from ksearch_graph.harness._torch import load_torch
from ksearch_graph.harness.reporting import progress
from ksearch_graph.harness.spin_cores import pinned

TIMING = "timing"  # the one exclusive hold; the others are shared, and named for the record
CHECKING, STARTING, STOPPING = "checking", "starting", "stopping"
WAITING_FOR_GPU = "waiting for the device (another evaluation is timing on it)"


def device_name(device: str) -> str:
    return str(load_torch().cuda.get_device_properties(0).uuid) if device == "cuda" else "cpu"


class DeviceShare:
    """One judge's holds on its device. ``spans``: (what, start, end) of every hold, wall clock; ``waited_s``: time
    spent waiting for a hold."""

    def __init__(self, lock_dir: str, device: str):
        self.lock_dir, self.device = lock_dir, device
        self.spans: list[tuple[str, float, float]] = []
        self.waited_s = 0.0
        self._name: str | None = None
        self.polling_core: int | None = None  # while timing, this thread keeps to it (spin_cores.py)

    def _path(self, kind: str) -> str:
        if self._name is None:
            self._name = device_name(self.device)
            os.makedirs(self.lock_dir, exist_ok=True)
        return os.path.join(self.lock_dir, f"ksearch-{kind}-{self._name}.lock")

    @contextlib.contextmanager
    def hold(self, what: str):
        """``what``: TIMING (exclusive), or CHECKING, STARTING or STOPPING (shared)."""
        exclusive = what == TIMING
        t0 = time.perf_counter()
        with open(self._path("turnstile"), "a") as turnstile, open(self._path("timing"), "a") as device:
            if not _try(turnstile, fcntl.LOCK_EX) or not _try(device, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH):
                progress(WAITING_FOR_GPU)
                fcntl.flock(turnstile, fcntl.LOCK_EX)
                fcntl.flock(device, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
                progress(f"{what}, after {time.perf_counter() - t0:.1f} s waiting for the device")
            # Held by a timer until it has the device, by a checker only to pass: once a timer waits, no new check
            # starts, so it waits at most for the checks already running.
            fcntl.flock(turnstile, fcntl.LOCK_UN)
            self.waited_s += time.perf_counter() - t0
            start = time.time()
            try:
                with pinned(self.polling_core if exclusive else None):
                    yield
            finally:
                self.spans.append((what, start, time.time()))
                fcntl.flock(device, fcntl.LOCK_UN)


def _try(f, how: int) -> bool:
    try:
        fcntl.flock(f, how | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
