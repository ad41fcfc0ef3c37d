"""The local evaluation pool: one lease per GPU (or per CPU slot), behind the ``Evaluator`` interface.

Every evaluation holds one slot from start to end. On a GPU slot the judge and candidate processes see only that
GPU (``CUDA_VISIBLE_DEVICES``), so timing on one GPU never waits for another; each slot has its own
``SubprocessEvaluator`` and so its own reference timings and prestarted processes. Callers evaluate from several
threads at once (the graph's parallel cycles and samples); a caller waits while every slot is lent.

A GPU may have several slots (``lanes``): their evaluations start, import, compile and check side by side while
one of them times, so the GPU is not idle between timings. The judges share the GPU by its own locks
(harness/judge/gpu_share.py): timing alone, everything else that touches the GPU side by side.

A candidate that breaks its GPU (an illegal address, a hang killed at the timeout) costs only its own lease: before
that GPU is lent again a fresh process runs a tiny CUDA operation on it; a GPU that fails the check stays out of the
pool and is checked again every ``recheck_s``.

A pool is one GPU model: scores are speed-ups measured on one kind of GPU, so a search must not compare numbers
from different models. A host with mixed GPUs is refused with the models listed (pick one kind with ``--gpus``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ksearch_graph.harness.parent.client import gpu_driver_present
from ksearch_graph.harness.parent.failures import infrastructure_error
from ksearch_graph.tasks.evaluation import EvalResult, Evaluator, Status
from ksearch_graph.tasks.task import Task

HEALTH_CHECK = ("import torch; x = torch.ones(1 << 20, device='cuda'); torch.cuda.synchronize(); "
                "assert float(x.sum()) == float(1 << 20)")


class PoolError(ValueError):
    """A pool that cannot be built as asked (unknown GPU index, mixed GPU models, ...): a usage error."""


@dataclass
class Slot:
    name: str  # "gpu3" or "cpu0"
    model: str  # the GPU's name, or "cpu"
    gpu: str | None  # the CUDA index it pins evaluations to; None for a CPU slot
    evaluator: Evaluator
    healthy: bool = True
    busy_s: float = 0.0


@dataclass
class Interval:
    slot: str
    attempt_id: str
    start: float  # time.monotonic()
    end: float


@dataclass
class EvaluationPool:
    """Lends slots to ``evaluate`` calls; at most one evaluation per slot at any time."""

    slots: list[Slot]
    recheck_s: float = 30.0
    python: str = sys.executable
    intervals: list[Interval] = field(default_factory=list)  # every evaluation's lease, for tests and benchmarks

    def __post_init__(self):
        if not self.slots:
            raise PoolError("an evaluation pool needs at least one slot")
        self._free = list(self.slots)
        self._leased: set[str] = set()  # names of the slots evaluating now
        self._cond = threading.Condition()
        self._closed = False
        self.started = time.monotonic()

    @property
    def model(self) -> str:
        return self.slots[0].model

    def evaluate(self, task: Task, files: dict[str, str], *, attempt_id: str) -> EvalResult:
        slot = self._lease()
        if slot is None:
            return infrastructure_error("every GPU of the pool failed its health check")
        start = time.monotonic()
        try:
            result = slot.evaluator.evaluate(task, files, attempt_id=attempt_id)
        except Exception as e:  # an evaluator should not raise; if it does, the slot is still given back
            result = infrastructure_error(f"the evaluator of slot {slot.name} failed", f"{type(e).__name__}: {e}")
        end = time.monotonic()
        result.environment.update(pool_slot=slot.name, gpu_model=slot.model)
        healthy = True
        if slot.gpu is not None and _may_have_broken_gpu(result):
            healthy = self.check(slot)
            result.environment["gpu_checked_after"] = "healthy" if healthy else "failed; taken out of the pool"
        self._give_back(slot, Interval(slot.name, attempt_id, start, end), healthy)
        return result

    def lanes_of(self, slot: Slot) -> list[Slot]:
        """The slots that share ``slot``'s GPU (itself alone for a CPU slot)."""
        return [s for s in self.slots if s is slot or (slot.gpu is not None and s.gpu == slot.gpu)]

    def check(self, slot: Slot) -> bool:
        """A tiny CUDA operation on the slot's GPU, in a fresh process: True if it works."""
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"} | {
            "CUDA_VISIBLE_DEVICES": child_device(slot.gpu)}
        try:
            return subprocess.run([self.python, "-c", HEALTH_CHECK], env=env, capture_output=True,
                                  timeout=120).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def utilisation(self, since: float | None = None, until: float | None = None) -> float:
        """Share of slot-time leased to evaluations between ``since`` and ``until`` (monotonic clock)."""
        with self._cond:
            intervals = list(self.intervals)
        return busy_share(intervals, len(self.slots), self.started if since is None else since,
                          time.monotonic() if until is None else until)

    def start_ahead(self, task: Task | None = None) -> None:
        for slot in self.slots:
            getattr(slot.evaluator, "start_ahead", lambda t: None)(task)

    def close(self) -> None:
        for slot in self.slots:
            getattr(slot.evaluator, "close", lambda: None)()

    # ------------------------------------------------------------------ leasing

    def _lease(self) -> Slot | None:
        with self._cond:
            while not self._free:
                if not any(s.healthy for s in self.slots):
                    return None
                self._cond.wait()
            slot = self._free.pop(0)
            self._leased.add(slot.name)
            return slot

    def _give_back(self, slot: Slot, interval: Interval, healthy: bool) -> None:
        with self._cond:
            self.intervals.append(interval)
            slot.busy_s += interval.end - interval.start
            self._leased.discard(slot.name)
            if healthy and slot.healthy:
                self._free.append(slot)
            elif not healthy:  # the GPU is out, with every lane on it; lanes still evaluating stay out when done
                for lane in self.lanes_of(slot):
                    lane.healthy = False
                    if lane in self._free:
                        self._free.remove(lane)
            self._cond.notify_all()
        if not healthy:
            threading.Thread(target=self._recheck, args=(slot,), daemon=True).start()

    def _recheck(self, slot: Slot) -> None:
        while True:
            time.sleep(self.recheck_s)
            if self.check(slot):
                with self._cond:
                    for lane in self.lanes_of(slot):  # a lane still evaluating comes back when it is done
                        lane.healthy = True
                        if lane not in self._free and lane.name not in self._leased:
                            self._free.append(lane)
                    self._cond.notify_all()
                return


def busy_share(intervals: list[Interval], slots: int, since: float, until: float) -> float:
    """Leased slot-time between ``since`` and ``until`` over the slot-time there was."""
    busy = sum(max(0.0, min(i.end, until) - max(i.start, since)) for i in intervals)
    return busy / max(1e-9, (until - since) * slots)


def _may_have_broken_gpu(result: EvalResult) -> bool:
    """A crash or a hang may leave the GPU unusable (an illegal address poisons the context; a hang may still run)."""
    if result.status not in (Status.runtime_error, Status.timeout):
        return False
    return result.environment.get("gpu_healthy_after") is not True


# ---------------------------------------------------------------------- building a pool


def visible_gpus() -> list[tuple[str, str]]:
    """(CUDA index, model name) of each GPU this process may use, in CUDA order; [] without a GPU."""
    if not gpu_driver_present() or shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = [tuple(part.strip() for part in line.split(",", 1)) for line in out.splitlines() if "," in line]
    chosen = allowed_devices()
    if chosen is None:
        return gpus
    # CUDA renumbers the visible GPUs from 0 in the order given.
    physical = dict(gpus)
    return [(str(i), physical[d]) for i, d in enumerate(chosen) if d in physical]


def allowed_devices() -> list[str] | None:
    """The GPUs this process may use, as its ``CUDA_VISIBLE_DEVICES`` names them; None where it is not set."""
    allowed = os.environ.get("CUDA_VISIBLE_DEVICES")
    return None if allowed is None else [d.strip() for d in allowed.split(",") if d.strip()]


def child_device(index: str) -> str:
    """What a child's ``CUDA_VISIBLE_DEVICES`` names so that it sees this process's GPU ``index`` (CUDA numbers the GPUs
    this process may use from 0: under ``CUDA_VISIBLE_DEVICES=2,3`` our GPU 0 is the host's 2)."""
    chosen = allowed_devices()
    if chosen is None or not index.isdigit():
        return index
    return chosen[int(index)] if int(index) < len(chosen) else index


def default_cpu_slots() -> int:
    """Without a GPU: half the cores, at least one. An evaluation keeps about two processes busy at times (the judge
    and the candidate's, each importing torch), so one slot per core would make every evaluation slower."""
    return max(1, (os.cpu_count() or 1) // 2)


def parse_gpus(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items or not all(t.isdigit() for t in items) or len(set(items)) != len(items):
        raise PoolError(f"--gpus wants distinct GPU indices like 0,1,3, not {text!r}")
    return items


def local_pool(make_evaluator: Callable[[dict[str, str]], Evaluator], *, gpus: str | None = None,
               cpu_slots: int | None = None, lanes: int = 1) -> EvaluationPool:
    """``lanes`` slots per chosen visible GPU (``gpus`` "0,1,3"; default all), or ``cpu_slots`` CPU slots without a
    GPU. ``make_evaluator(env)`` builds a slot's evaluator with the environment its evaluations get."""
    if lanes < 1:
        raise PoolError(f"--lanes-per-gpu must be at least 1, not {lanes}")
    found = visible_gpus()
    if gpus is not None:
        wanted = parse_gpus(gpus)
        known = dict(found)
        missing = [g for g in wanted if g not in known]
        if missing:
            raise PoolError(f"--gpus {gpus}: no visible GPU {', '.join(missing)} "
                            f"(visible: {', '.join(i for i, _ in found) or 'none'})")
        found = [(g, known[g]) for g in wanted]
    if found:
        models = sorted({m for _, m in found})
        if len(models) > 1:
            listing = "; ".join(f"{m}: --gpus {','.join(i for i, mm in found if mm == m)}" for m in models)
            raise PoolError(f"the GPUs given are of {len(models)} models, and scores measured on different models "
                            f"cannot be compared within one search. Choose one model: {listing}")
        if cpu_slots is not None:
            raise PoolError("--cpu-slots is for machines without a GPU; choose GPUs with --gpus")
        return EvaluationPool([Slot(f"gpu{i}" if lanes == 1 else f"gpu{i}.{lane}", m, i,
                                    make_evaluator({"CUDA_VISIBLE_DEVICES": child_device(i)}))
                               for i, m in found for lane in range(lanes)])
    if cpu_slots is not None and cpu_slots < 1:
        raise PoolError(f"--cpu-slots must be at least 1, not {cpu_slots}")
    n = cpu_slots or default_cpu_slots()
    return EvaluationPool([Slot(f"cpu{i}", "cpu", None, make_evaluator({})) for i in range(n)])
