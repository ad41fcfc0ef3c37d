"""Speed of light: how far a kernel is from the fastest its GPU could possibly run a workload.

Every timed workload has a **work**: the bytes a kernel must move (inputs read once, outputs written once) and the
flops it must do, with the kind of arithmetic they may run on. On a GPU with known peaks (``gpu_specs.py``) that
gives a **floor**: the longer of bytes / bandwidth and flops / peak throughput. An attempt's **fraction of the
floor** is floor / measured latency: 1.0 is the floor itself, and a result above 1.0 is faster than the hardware
allows, so it is flagged implausible (a measurement or correctness problem, not a kernel to celebrate).

Where the work comes from, first found wins (docs/speed-of-light.md):
1. the workload's ``work`` in task.json (``{"bytes", "flops", "compute"}``);
2. the reference file's ``speed_of_light(params)``, for work that depends on the params in ways only the task knows
   (ragged lengths, pages, routing);
3. derived from the reference: ``make_inputs`` and the reference run on tensors without data (fake or meta
   tensors), every input read once and every output written once, flops counted by torch's flop counter. Right for
   dense tasks; a task that touches only part of its inputs (a paged cache) must declare instead.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from ksearch_graph.tasks.evaluation import EvalResult
from ksearch_graph.tasks.gpu_specs import COMPUTE_KINDS, GpuSpec, gpu_spec
from ksearch_graph.tasks.task import Task

# The default kind of arithmetic, when a task does not say: 16-bit tensor cores if the tolerance leaves room for
# their rounding (1e-3 or looser), else FP32. A floor must never be above what a correct kernel can reach.
_TENSOR_CORE_TOLERANCE = 1e-3


@dataclass(frozen=True)
class Work:
    bytes: int
    flops: int
    compute: str  # one of gpu_specs.COMPUTE_KINDS
    source: str  # "task.json", "reference speed_of_light()" or "derived from the reference"
    note: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Floor:
    workload: str
    work: Work
    memory_us: float
    compute_us: float

    @property
    def floor_us(self) -> float:
        return max(self.memory_us, self.compute_us)

    @property
    def bound(self) -> str:
        return "memory" if self.memory_us >= self.compute_us else "compute"


class WorkError(ValueError):
    """A task's declared work is malformed, or its speed_of_light() failed."""


# ------------------------------------------------------------------------------------------------ work per workload


def default_compute(task: Task) -> str:
    tol = task.spec.tolerance
    return "fp16" if max(tol.atol, tol.rtol) >= _TENSOR_CORE_TOLERANCE else "fp32"


def task_work(task: Task) -> dict[str, Work | str]:
    """Work of every timed workload, or a one-line reason why it is unknown. Runs the task's own code (reference.py,
    never a candidate's)."""
    out: dict[str, Work | str] = {}
    module = None
    for workload in task.spec.workloads:
        if not workload.timed:
            continue
        try:
            if workload.work is not None:
                out[workload.name] = _checked(workload.work.model_dump(), task, "task.json")
                continue
            if module is None:
                module = _reference_module(task)
            if hasattr(module, "speed_of_light"):
                out[workload.name] = _checked(module.speed_of_light(dict(workload.params)), task,
                                              "reference speed_of_light()")
            else:
                out[workload.name] = _derived(module, task, workload.params)
        except Exception as e:  # the task's code: any failure is a reason, never a crash of the search
            out[workload.name] = f"unknown: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    return out


def work_from_json(data: dict[str, Any]) -> dict[str, Work | str]:
    """The inverse of ``work_to_json``: what the store keeps."""
    return {name: Work(**value) if isinstance(value, dict) else str(value) for name, value in data.items()}


def work_to_json(work: dict[str, Work | str]) -> dict[str, Any]:
    return {name: w.as_dict() if isinstance(w, Work) else w for name, w in work.items()}


def _checked(declared: Any, task: Task, source: str) -> Work:
    if not isinstance(declared, dict):
        raise WorkError(f"work must be an object with bytes and flops, not {declared!r}")
    unknown = set(declared) - {"bytes", "flops", "compute", "note"}
    if unknown:
        raise WorkError(f"work has unknown fields {sorted(unknown)}")
    compute = declared.get("compute") or default_compute(task)
    if compute not in COMPUTE_KINDS:
        raise WorkError(f"compute must be one of {COMPUTE_KINDS}, not {compute!r}")
    values = {k: declared.get(k, 0) for k in ("bytes", "flops")}
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or not math.isfinite(value):
            raise WorkError(f"work.{key} must be a number >= 0, not {value!r}")
    if not values["bytes"] and not values["flops"]:
        raise WorkError("work has neither bytes nor flops")
    return Work(int(values["bytes"]), int(values["flops"]), compute, source, str(declared.get("note", "")))


def _reference_module(task: Task):
    import hashlib

    from ksearch_graph.harness.modules import load_module

    path = task.path(task.spec.reference)
    name = "ksearch_sol_reference_" + hashlib.sha256(str(path).encode()).hexdigest()[:12]
    # No __pycache__ beside it: the task folder is the run directory's, which readers (show, report) never change.
    before, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        return load_module(name, str(path))
    finally:
        sys.dont_write_bytecode = before


def _derived(module, task: Task, params: dict) -> Work:
    """Bytes of every input and output tensor and the reference's flops, on tensors that hold no data: fake tensors
    first (nothing is drawn), else the meta device (inputs drawn on the CPU, then dropped)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    errors = []
    for mode, device in ((FakeTensorMode, "cpu"), (None, "meta")):
        try:
            with _quiet_torch(), mode() if mode else _nothing():
                inputs = module.make_inputs(dict(params), 0, device)
                with FlopCounterMode(display=False) as counter:
                    if task.spec.entry_kind == "module":
                        init_args, state, *forward = inputs
                        model = module.reference(*init_args)
                        model.load_state_dict(state, strict=True)
                        output = model(*forward)
                    else:
                        output = module.reference(*inputs)
                flops = counter.get_total_flops()
                moved = _tensor_bytes(inputs, torch) + _tensor_bytes(output, torch)
            return Work(moved, int(flops), default_compute(task), "derived from the reference",
                        "inputs read once, outputs written once")
        except Exception as e:
            errors.append(f"{device}: {type(e).__name__}")
    raise WorkError("the reference cannot run without data (" + ", ".join(errors) + "); declare the work in "
                    "task.json or define speed_of_light(params) in the reference file")


class _quiet_torch:
    """Torch logs every operator a fake tensor cannot run as an error; here that only means "try the next way"."""

    NAMES = ("torch._subclasses.fake_tensor", "torch._subclasses", "torch.fx")

    def __enter__(self):
        import logging

        self.saved = [(logging.getLogger(n), logging.getLogger(n).level) for n in self.NAMES]
        for logger, _ in self.saved:
            logger.setLevel(logging.CRITICAL)
        return self

    def __exit__(self, *exc):
        for logger, level in self.saved:
            logger.setLevel(level)
        return False


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _tensor_bytes(value: Any, torch) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v, torch) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v, torch) for v in value)
    return 0


# ------------------------------------------------------------------------------------------------ floors


def floors(work: dict[str, Work | str], gpu: GpuSpec | None) -> dict[str, Floor]:
    """The floor of every workload with a known work, on ``gpu`` (none without a GPU spec)."""
    if gpu is None:
        return {}
    return {name: Floor(name, w, w.bytes / gpu.bandwidth * 1e6, w.flops / gpu.peak_flops(w.compute) * 1e6)
            for name, w in work.items() if isinstance(w, Work)}


@dataclass(frozen=True)
class Fractions:
    """An attempt against the floor: per workload and their geometric mean."""

    gpu: str
    per_workload: dict[str, float]  # workload -> floor / latency
    floor_us: dict[str, float]

    @property
    def fraction(self) -> float | None:
        values = list(self.per_workload.values())
        if not values:
            return None
        return math.exp(sum(math.log(v) for v in values) / len(values))

    @property
    def implausible(self) -> list[str]:
        """Workloads measured faster than the hardware allows."""
        return [name for name, f in self.per_workload.items() if f > 1.0]

    def as_dict(self) -> dict:
        return {"gpu": self.gpu, "fraction": self.fraction, "per_workload": self.per_workload,
                "floor_us": self.floor_us, "implausible": self.implausible}


def device_of(result: EvalResult) -> str | None:
    """The GPU an evaluation ran on, as it recorded it (None: on the CPU)."""
    env = result.environment
    if env.get("device") not in (None, "cuda") or env.get("triton_interpret"):
        return None
    return env.get("gpu") or (env.get("gpu_model") if env.get("gpu_model") != "cpu" else None)


WorkSource = dict[str, Work | str] | Callable[[], dict[str, Work | str]]  # the work, or what works it out


def fractions(result: EvalResult, work: WorkSource) -> Fractions | None:
    """The attempt's fraction of the floor, on the GPU it was measured on; None without GPU timings, a known GPU or
    a known work. ``work`` may be a function, called only when there is a floor to compute (it imports torch)."""
    if not result.passed or not result.timing_representative:
        return None
    spec = gpu_spec(device_of(result))
    if spec is None:
        return None
    by_name = floors(work() if callable(work) else work, spec)
    per, floor_us = {}, {}
    for w in result.workloads:
        f = by_name.get(w.workload)
        if f is None or not w.timed or not w.latency_us or w.latency_us <= 0:
            continue
        per[w.workload] = f.floor_us / w.latency_us
        floor_us[w.workload] = f.floor_us
    if not per:
        return None
    return Fractions(spec.name, per, floor_us)


# ------------------------------------------------------------------------------------------------ text for people


def fmt_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def fmt_flops(n: float) -> str:
    for unit, size in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("KFLOP", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} FLOP"


def fmt_percent(fraction: float | None) -> str:
    return "–" if fraction is None else f"{100 * fraction:.3g}%"


def sol_summary(fr: dict | None) -> str:
    """One line for `ksearch show` and the report, from ``Fractions.as_dict()``."""
    if not fr:
        return ""
    text = f"{fmt_percent(fr['fraction'])} of the speed-of-light floor on {fr['gpu']} (geometric mean over workloads)"
    if fr["implausible"]:
        text += f"; IMPLAUSIBLE: faster than the floor on {', '.join(fr['implausible'])}"
    return text


# ------------------------------------------------------------------------------------------------ one run's view


WORK_META = "workload_work"  # the store's meta key: the task's work, computed once per run


class SpeedOfLight:
    """What a run knows about its hardware and its workloads' work: the prompts' GPU facts and every floor.

    ``device``: the GPU's name as the run recorded it (None or "cpu" without one). ``work``: the work, or a function
    that works it out, called the first time it is needed."""

    def __init__(self, device: str | None, work: WorkSource):
        self.device = device
        self._work = work

    @functools.cached_property
    def work(self) -> dict[str, Work | str]:
        return self._work() if callable(self._work) else self._work

    @property
    def gpu(self) -> GpuSpec | None:
        return gpu_spec(self.device)

    def floors(self) -> dict[str, Floor]:
        return floors(self.work, self.gpu)

    def fractions(self, result: EvalResult) -> Fractions | None:
        return fractions(result, lambda: self.work)


def run_work(store, task: Task, *, save: bool) -> dict[str, Work | str]:
    """The task's work as the run recorded it; computed (and, with ``save``, recorded) when it has none yet."""
    stored = store.get_meta(WORK_META)
    if stored is not None:
        return work_from_json(stored)
    work = task_work(task)
    if save:
        store.set_meta(WORK_META, work_to_json(work))
    return work


def row_fractions(row: dict | None, work: WorkSource) -> Fractions | None:
    """The fraction of the floor of a stored attempt (a store row)."""
    if not row or not row.get("result"):
        return None
    return fractions(EvalResult.model_validate_json(row["result"]), work)
