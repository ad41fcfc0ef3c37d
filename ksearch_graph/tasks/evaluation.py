"""The evaluation interface: what the compile-and-bench node asks, and what it gets back.

The graph never runs candidate code itself. It hands a candidate (its files) to an ``Evaluator``
and gets an ``EvalResult`` back; failures (a compile error, a crash, a hang, a wrong answer) are
results, never exceptions. A failure the candidate did not cause (the pool, a Ray worker, the judge's own process,
the task's reference, the disk) is ``infrastructure_error``, with ``infrastructure`` saying what failed
(``harness/parent/failures.py``): the search never records it as the candidate's attempt (``infrastructure.py``). ``harness.client.SubprocessEvaluator`` is the evaluator that runs candidates; the
harness (``ksearch_graph/harness/``) is its two processes.
"""

from __future__ import annotations

import math
import re
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, Field

if TYPE_CHECKING:  # the Evaluator's signature only; a task's files need no evaluation types
    from ksearch_graph.tasks.task import Task


class Status(StrEnum):
    passed = "passed"
    compile_error = "compile_error"
    runtime_error = "runtime_error"
    timeout = "timeout"
    incorrect_shape = "incorrect_shape"
    incorrect_dtype = "incorrect_dtype"
    incorrect_numerical = "incorrect_numerical"
    suspicious = "suspicious"
    unavailable = "unavailable"  # e.g. a CUDA candidate on a machine without a GPU
    # Not the candidate's: the evaluation could not judge it (``infrastructure`` says why). Never recorded as an
    # attempt, never shown to the LLM, never counted against the action (docs/scale-out.md, "Infrastructure").
    infrastructure_error = "infrastructure_error"


class WorkloadResult(BaseModel):
    workload: str
    correct: bool
    max_abs_error: float | None = None  # over the correctness calls; for a failed workload, of the failing call
    max_rel_error: float | None = None  # max |out - ref| / |ref| over elements with |ref| >= 1e-6
    latency_us: float | None = None  # mean of the timed calls
    median_us: float | None = None
    std_us: float | None = None
    runs: int = 0
    reference_us: float | None = None
    speedup: float | None = None  # reference_us / latency_us
    baseline_us: float | None = None  # the task's baseline, timed the same way in the same evaluation
    speedup_vs_baseline: float | None = None  # baseline_us / latency_us
    timed: bool = True  # False: a correctness-only workload
    # GPU only: the candidate's calls held the GPU at its power limit in their heat, so untimed calls kept it as
    # loaded between timed calls as sustained use would (its clock is lower then; see harness/policy.py, FILL_DUTY).
    power_limited: bool | None = None


class EvalResult(BaseModel):
    status: Status
    workloads: list[WorkloadResult] = []
    # Geometric mean over workloads of reference latency / candidate latency; 0 unless passed.
    score: float = 0.0
    latency_us: float | None = None  # geometric mean of the candidate's per-workload latency
    # Against the task's baseline (when it has one): geometric-mean speedup, and the K-Search / FlashInfer-Bench
    # plots' score, 100 x the arithmetic mean of baseline latency / candidate latency.
    speedup_vs_baseline: float | None = None
    baseline_score: float | None = None
    compile_s: float = 0.0
    wall_s: float = 0.0
    # Where the wall time went, in seconds: spawn, imports, inputs, reference, compile, correctness, timing.
    phases: dict[str, float] = {}
    # The judge's holds on its device (harness/judge/gpu_share.py): [what, start, end], wall clock; "timing" alone on
    # the device; "starting", "checking" and "stopping" beside other evaluations' shared holds. A pool's busy share
    # is their union over the run.
    device_spans: list[tuple[str, float, float]] = []
    # Things worth a second look that do not fail the candidate, e.g. "calls_reference".
    flags: list[str] = []
    # What the LLM is shown: the error itself, not pages of traceback.
    log_excerpt: str = ""
    # With status infrastructure_error: what failed outside the candidate, in one line (e.g. "the Ray worker was
    # lost twice"); the details are in log_excerpt.
    infrastructure: str = ""
    # False on CPU (Triton interpreter): the numbers order candidates but mean nothing for a GPU.
    timing_representative: bool = False
    environment: dict[str, Any] = {}
    # Reference/baseline timings this evaluation measured, for the evaluator to reuse in the session's next ones
    # (not part of the record: model_dump leaves it out).
    reference_timings: dict[str, Any] = Field(default={}, exclude=True)

    @property
    def passed(self) -> bool:
        return self.status == Status.passed

    @property
    def infrastructure_failed(self) -> bool:
        return self.status == Status.infrastructure_error

    def summary(self) -> dict[str, Any]:
        """The few numbers the world model keeps for an attached attempt."""
        return {
            "status": self.status.value,
            "score": round(self.score, 4),
            "latency_us": None if self.latency_us is None else round(self.latency_us, 3),
        }


def geometric_mean(values: list[float]) -> float:
    if not values or any(v <= 0 for v in values):
        return 0.0
    return math.exp(sum(math.log(v) for v in values) / len(values))


class Evaluator(Protocol):
    def evaluate(self, task: Task, files: dict[str, str], *, attempt_id: str) -> EvalResult: ...


_EXCEPTION_LINE = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning))(:.*)?$")
_WHERE = re.compile(r'^\s*File "([^"]+)", line (\d+)')


def error_headline(log: str) -> str:
    """The line that says what went wrong: the last exception line of a traceback (with the file and line of a
    syntax error, ``SyntaxError: invalid syntax (kernel.py, line 3)``), else the first line that is not only a
    label ending in ':'."""
    lines = [line.rstrip() for line in (log or "").strip().splitlines() if line.strip()]
    where = None
    for line in lines:
        if found := _WHERE.match(line):
            where = f"{found.group(1).rsplit('/', 1)[-1]}, line {found.group(2)}"
    exceptions = [line.strip() for line in lines if _EXCEPTION_LINE.match(line)]
    if exceptions:
        last = exceptions[-1]
        if where and last.split(":")[0].endswith(("SyntaxError", "IndentationError", "TabError")):
            last += f" ({where})"
        return last
    return next((line.strip() for line in lines if not line.endswith(":")), lines[0] if lines else "")
