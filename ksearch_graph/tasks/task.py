"""A kernel task: what to optimise, how to check it, and on which inputs.

A task is a folder with a ``task.json`` (see ``TaskSpec``) next to the files it names:

- ``spec.md``: the problem statement shown to the planner and coder,
- ``reference.py``: ``make_inputs(params, seed, device) -> tuple`` and ``reference(*inputs) -> Tensor``,
- optionally a seed solution, and for the offline (no-LLM) search a parameterised template.

The task is loaded once, validated with pydantic, and turned into a small JSON-friendly ``Task``
that the graph and the evaluator share. A malformed task file is a ``TaskError`` with a message
that names the file and the field, never a traceback from deep inside the search.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from ksearch_graph.harness.requirements import parse_requires
from ksearch_graph.harness.task_checks import parse_check
from ksearch_graph.harness.tasks import TASK_DEFAULTS, TOLERANCE_DEFAULTS, WORKLOAD_TIMED_DEFAULT
from ksearch_graph.harness.writable import parse_writable

# triton / pytorch / cupy: a Python file (``solution_file``) defining the entry point (cupy: CUDA C++ compiled by
# NVRTC through ``cupy.RawModule``). cuda: CUDA C++ built as a torch extension from ``kernel.cu`` (+ ``kernel.h``,
# other .cu/.cpp/.h files) and ``main.cpp``, which binds the entry point with pybind11 (K-Search / FlashInfer-Bench).
Language = Literal["triton", "pytorch", "cupy", "cuda"]


class TaskError(ValueError):
    """The task folder or its task.json is not usable."""


class Tolerance(BaseModel):
    atol: float = Field(TOLERANCE_DEFAULTS["atol"], ge=0)
    rtol: float = Field(TOLERANCE_DEFAULTS["rtol"], ge=0)
    # Fraction of elements that must be within tolerance (1.0 = all). FP8/FP4 tasks use e.g. 0.95.
    matched_ratio: float = Field(TOLERANCE_DEFAULTS["matched_ratio"], gt=0, le=1)


ComputeKind = Literal["fp32", "tf32", "fp16", "bf16", "fp8"]  # gpu_specs.COMPUTE_KINDS


class WorkloadWork(BaseModel):
    """What a workload must at least do, for its speed-of-light floor (speed_of_light.py)."""

    model_config = {"extra": "forbid"}

    bytes: int = Field(ge=0)  # moved to and from device memory: inputs read once, outputs written once
    flops: int = Field(0, ge=0)
    compute: ComputeKind | None = None  # the arithmetic the flops may run on; None: by the tolerance
    note: str = ""


class Workload(BaseModel):
    name: str
    params: dict[str, Any]
    # False for correctness-only cases (GPU MODE's "test" shapes): checked, never timed.
    timed: bool = WORKLOAD_TIMED_DEFAULT
    # Declared work for the speed-of-light floor; None: the reference's speed_of_light(params), else derived.
    work: WorkloadWork | None = None


class CheckSpec(BaseModel):
    """The task's own correctness check (GPU MODE's check_implementation): ``function(*inputs, output)`` in the task
    folder's ``module``, run by the judge instead of the elementwise comparison (harness/task_checks.py)."""

    model_config = {"extra": "forbid"}

    module: str
    function: str

    @model_validator(mode="after")
    def _valid(self) -> CheckSpec:
        parse_check(self.model_dump(), "task.json")
        return self


class Requirements(BaseModel):
    """What the machine needs to run the task (harness/requirements.py); unmet, an evaluation is ``unavailable``."""

    model_config = {"extra": "forbid"}

    device: Literal["cuda", "cpu"] | None = None
    rocm: bool | None = None
    compute_capability: tuple[int, int] | None = None
    python_modules: list[str] | None = None
    why: str | None = None

    @model_validator(mode="after")
    def _valid(self) -> Requirements:
        parse_requires(self.model_dump(exclude_none=True, mode="json"), "task.json")
        return self


class TemplateParameter(BaseModel):
    """One knob of the offline template: its allowed values, in a meaningful order."""

    values: list[Any] = Field(min_length=1)
    default: Any
    # Which axis of the kernel it mostly affects; the offline planner words its actions with it.
    affects: str = ""

    @field_validator("default")
    @classmethod
    def _default_allowed(cls, v: Any, info) -> Any:
        values = info.data.get("values") or []
        if values and v not in values:
            raise ValueError(f"default {v!r} is not one of {values!r}")
        return v


class TemplateVariant(BaseModel):
    """An algorithm family of the template, e.g. single-pass vs. online softmax."""

    title: str
    description: str
    difficulty: int = Field(2, ge=1, le=5)
    prior: float = Field(0.5, ge=0, le=1)  # how promising the offline planner thinks it is


class TemplateSpec(BaseModel):
    """A parameterised kernel the offline coder fills in (``{{NAME}}`` placeholders)."""

    file: str
    parameters: dict[str, TemplateParameter]
    variants: dict[str, TemplateVariant] = Field(min_length=1)


class TaskSpec(BaseModel):
    """The on-disk ``task.json``."""

    name: str = Field(min_length=1)
    description: str = ""
    spec: str = "spec.md"
    reference: str = TASK_DEFAULTS["reference"]
    entry_point: str = Field(min_length=1)
    # function: entry_point(*inputs) is the kernel. module: entry_point is an nn.Module class (KernelBench's
    # ModelNew); make_inputs returns (init_args, state_dict, *forward_inputs), the harness builds
    # entry_point(*init_args) on the device, loads state_dict (strict) and times model(*forward_inputs).
    # The reference file's ``reference`` follows the same kind.
    entry_kind: Literal["function", "module"] = TASK_DEFAULTS["entry_kind"]
    language: Language = TASK_DEFAULTS["language"]  # what the coder writes by default
    allowed_languages: list[Language] = []  # what the harness accepts; just ``language`` when empty
    solution_file: str = TASK_DEFAULTS["solution_file"]
    tolerance: Tolerance = Tolerance()
    workloads: list[Workload] = Field(min_length=1)
    # The subset used for feedback during search; all workloads when empty.
    feedback_workloads: list[str] = []
    correctness_seeds: int = Field(TASK_DEFAULTS["correctness_seeds"], ge=1, le=32)
    seed_solution: str | None = None
    # The strongest available implementation (vendor kernel or well-written PyTorch, never the naive reference):
    # a Python file defining ``entry_point``, timed next to the reference in every evaluation.
    baseline: str | None = TASK_DEFAULTS["baseline"]
    template: TemplateSpec | None = None
    # How a timed call is measured. device: behind a launch cover that holds the GPU while the host launches, so only
    # device time counts (kernel speed). end_to_end: each call starts on an idle GPU, so its own host launch gaps
    # count too, as GPU MODE and FlashInfer-Bench time (what a caller of the function waits). docs/gpumode.md.
    timing: Literal["device", "end_to_end"] = TASK_DEFAULTS["timing"]
    # Cast output and reference to this dtype and compare values, the output's dtype not part of the contract
    # (GPU MODE's checker compares in float32). None: the output's dtype must be the reference's.
    compare_dtype: Literal["float32", "float64"] | None = TASK_DEFAULTS["compare_dtype"]
    # gpumode: the first correctness input set of each workload is drawn from the problem's own public seed (make_inputs
    # gets seed 0), the others and every timed call from hidden seeds. Tasks made by ksearch_graph.tasks.gpumode.
    input_source: Literal["task", "gpumode"] = TASK_DEFAULTS["input_source"]
    # The task's own check instead of the elementwise comparison with the reference (GPU MODE's check_implementation).
    check: CheckSpec | None = None
    # Inputs that are output buffers: written by the reference and by candidates, so not checked unchanged.
    writable_inputs: list[str] = []
    # What the machine needs (a GPU, ROCm, a compute capability, Python modules); unmet: ``unavailable``.
    requires: Requirements = Requirements()

    @field_validator("writable_inputs")
    @classmethod
    def _input_paths(cls, v: list[str]) -> list[str]:
        return parse_writable(v, "task.json")


class Task(BaseModel):
    """A loaded task: the spec plus the texts the prompts and the evaluator need."""

    root: str  # absolute path of the task folder
    spec: TaskSpec
    spec_text: str
    reference_source: str
    seed_source: str | None = None
    template_source: str | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    def feedback_workloads(self) -> list[Workload]:
        wanted = self.spec.feedback_workloads
        if not wanted:
            return list(self.spec.workloads)
        return [w for w in self.spec.workloads if w.name in wanted]

    def languages(self) -> list[str]:
        return list(self.spec.allowed_languages or [self.spec.language])

    def path(self, relative: str) -> Path:
        return Path(self.root) / relative


def _read(folder: Path, relative: str, what: str) -> str:
    path = folder / relative
    if not path.is_file():
        raise TaskError(f"{folder}/task.json names {what} '{relative}', but {path} does not exist")
    return path.read_text()


def load_task(path: str | Path) -> Task:
    """Load a task folder (or its task.json). Raises TaskError with a readable message."""
    path = Path(path).resolve()
    folder = path.parent if path.is_file() else path
    manifest = folder / "task.json"
    if not manifest.is_file():
        raise TaskError(f"{folder} is not a task folder: it has no task.json")
    try:
        raw = json.loads(manifest.read_text())
    except json.JSONDecodeError as e:
        raise TaskError(f"{manifest} is not valid JSON: {e}") from None
    try:
        spec = TaskSpec.model_validate(raw)
    except ValidationError as e:
        lines = [f"  {'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()]
        raise TaskError(f"{manifest} is not a valid task:\n" + "\n".join(lines)) from None
    if not any(w.timed for w in spec.workloads):
        raise TaskError(f"{manifest}: at least one workload must be timed")
    names = [w.name for w in spec.workloads]
    if len(set(names)) != len(names):
        raise TaskError(f"{manifest}: workload names must be unique")
    unknown = sorted(set(spec.feedback_workloads) - set(names))
    if unknown:
        raise TaskError(f"{manifest}: feedback_workloads names unknown workloads {unknown}")
    if spec.baseline:
        _read(folder, spec.baseline, "baseline")
    template_source = None
    if spec.template is not None:
        template_source = _read(folder, spec.template.file, "template")
        for name in spec.template.parameters:
            if "{{" + name + "}}" not in template_source:
                raise TaskError(f"{manifest}: template parameter {name} has no {{{{{name}}}}} in {spec.template.file}")
    return Task(
        root=str(folder),
        spec=spec,
        spec_text=_read(folder, spec.spec, "spec"),
        reference_source=_read(folder, spec.reference, "reference"),
        seed_source=_read(folder, spec.seed_solution, "seed_solution") if spec.seed_solution else None,
        template_source=template_source,
    )
