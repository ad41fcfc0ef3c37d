"""FlashInfer-Trace in and out: a Definition and its workloads become a task folder; a run becomes Solutions and Traces.

In: ``materialise_definition(path, out_dir)`` reads a FlashInfer-Trace dataset (the public ``flashinfer-trace`` layout)

    ROOT/definitions/<op_type>/<name>.json     a Definition
    ROOT/workloads/<op_type>/<name>.jsonl      its workloads, one per line: a workload Trace
                                               {"definition": name, "workload": {uuid, axes, inputs}, ...}
                                               (a bare {uuid, axes, inputs} line is accepted too)
    ROOT/blob/...                              safetensors files that workload inputs point at

and writes a task folder that ``load_task`` loads: ``task.json``, ``spec.md`` (generated from the definition),
``reference.py`` (the definition's reference verbatim plus a generated ``make_inputs``) and ``flashinfer_trace.json``
(the original definition and workloads, which the export uses to write traces against the original names and uuids).
Everything is checked on the way in; a malformed file is a ``TaskError`` that names the file, the line and the field.
The schema follows ``flashinfer_bench.data`` 0.1.2 (checked against its pydantic models); flashinfer-bench itself is
not needed here.

Out: ``export_flashinfer_trace(run_dir, out_dir)`` writes ``OUT/solutions/<name>.json`` and
``OUT/traces/<definition>.jsonl`` (and, for a task that came from FlashInfer-Trace, ``OUT/definitions/<name>.json``),
so that OUT loads as a FlashInfer-Trace dataset (``flashinfer_bench.TraceSet.from_path``).
"""

from __future__ import annotations

import ast
import json
import math
import re
import struct
import uuid as uuidlib
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, Field, ValidationError, model_validator

from .task import Task, TaskError

META_FILE = "flashinfer_trace.json"
MAX_FEEDBACK_WORKLOADS = 8

# FlashInfer-Trace dtype -> (torch dtype attribute, safetensors header code or None when not checked).
DTYPES: dict[str, tuple[str, str | None]] = {
    "float32": ("float32", "F32"),
    "float16": ("float16", "F16"),
    "bfloat16": ("bfloat16", "BF16"),
    "float8_e4m3fn": ("float8_e4m3fn", "F8_E4M3"),
    "float8_e5m2": ("float8_e5m2", "F8_E5M2"),
    "float4_e2m1": ("float4_e2m1fn_x2", None),  # packed two per byte in torch; not checked against the header
    "int64": ("int64", "I64"),
    "int32": ("int32", "I32"),
    "int16": ("int16", "I16"),
    "int8": ("int8", "I8"),
    "bool": ("bool", "BOOL"),
}
DType = Literal["float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float4_e2m1",
                "int64", "int32", "int16", "int8", "bool"]

# Default tolerance by output dtype (the loosest over a definition's outputs wins): a kernel that reorders a
# reduction must pass, one that computes in a lower precision than the outputs carry must not.
TOLERANCE_BY_DTYPE: dict[str, dict[str, float]] = {
    "float32": {"atol": 1e-3, "rtol": 1e-3},
    "float16": {"atol": 1e-2, "rtol": 1e-2},
    "bfloat16": {"atol": 2e-2, "rtol": 2e-2},
    "float8_e4m3fn": {"atol": 1e-1, "rtol": 1e-1},
    "float8_e5m2": {"atol": 1e-1, "rtol": 1e-1},
    "float4_e2m1": {"atol": 5e-1, "rtol": 5e-1},
}
EXACT = {"atol": 0.0, "rtol": 0.0}  # integer and bool outputs

# Our language names -> FlashInfer-Trace's SupportedLanguages (python, triton, cpp, cuda, tilelang), and back.
LANGUAGE_TO_FLASHINFER = {"triton": "triton", "pytorch": "python", "cupy": "python", "cuda": "cuda"}
LANGUAGE_FROM_FLASHINFER = {"triton": "triton", "python": "pytorch", "cuda": "cuda"}

# Our evaluation statuses -> FlashInfer-Trace's EvaluationStatus. "suspicious" (a cheat caught) and "unavailable"
# have no counterpart there: the first is a wrong answer, the second could not run at all.
STATUS_TO_FLASHINFER = {
    "passed": "PASSED",
    "compile_error": "COMPILE_ERROR",
    "runtime_error": "RUNTIME_ERROR",
    "timeout": "TIMEOUT",
    "incorrect_shape": "INCORRECT_SHAPE",
    "incorrect_dtype": "INCORRECT_DTYPE",
    "incorrect_numerical": "INCORRECT_NUMERICAL",
    "suspicious": "INCORRECT_NUMERICAL",
    "unavailable": "RUNTIME_ERROR",
}


# ---------------------------------------------------------------------------------------------------- the schema

NonEmpty = Annotated[str, Field(min_length=1)]


class Axis(BaseModel):
    type: Literal["const", "var"]
    value: int | None = Field(None, ge=0)
    description: str | None = None

    @model_validator(mode="after")
    def _const_has_value(self) -> "Axis":
        if self.type == "const" and self.value is None:
            raise ValueError("a const axis needs a value")
        return self


class TensorSpec(BaseModel):
    shape: list[NonEmpty] | None  # None: a scalar
    dtype: DType
    description: str | None = None


class Definition(BaseModel):
    name: NonEmpty
    op_type: NonEmpty
    axes: dict[NonEmpty, Axis]
    inputs: dict[NonEmpty, TensorSpec]
    outputs: dict[NonEmpty, TensorSpec] = Field(min_length=1)
    reference: NonEmpty
    tags: list[str] = []
    description: str | None = None
    constraints: list[NonEmpty] = []

    @model_validator(mode="after")
    def _consistent(self) -> "Definition":
        try:
            tree = ast.parse(self.reference)
        except SyntaxError as e:
            raise ValueError(f"reference is not valid Python: {e.msg} (line {e.lineno})") from None
        if not any(isinstance(n, ast.FunctionDef) and n.name == "run" for n in tree.body):
            raise ValueError("reference must define a top-level function run(...)")
        both = set(self.inputs) & set(self.outputs)
        if both:
            raise ValueError(f"input and output names overlap: {sorted(both)}")
        for kind, tensors in (("input", self.inputs), ("output", self.outputs)):
            for name, spec in tensors.items():
                for axis in spec.shape or []:
                    if axis not in self.axes:
                        raise ValueError(f"{kind} {name!r} uses the undefined axis {axis!r}")
        for c in self.constraints:
            try:
                ast.parse(c, mode="eval")
            except SyntaxError:
                raise ValueError(f"constraint {c!r} is not a Python expression") from None
        return self

    @property
    def const_axes(self) -> dict[str, int]:
        return {k: a.value for k, a in self.axes.items() if a.type == "const"}

    @property
    def var_axes(self) -> list[str]:
        return [k for k, a in self.axes.items() if a.type == "var"]


class RandomInput(BaseModel):
    type: Literal["random"] = "random"


class ScalarInput(BaseModel):
    type: Literal["scalar"] = "scalar"
    value: bool | int | float


class SafetensorsInput(BaseModel):
    type: Literal["safetensors"] = "safetensors"
    path: NonEmpty  # relative to the dataset root, or absolute
    tensor_key: NonEmpty


InputSpec = Annotated[Union[RandomInput, ScalarInput, SafetensorsInput], Field(discriminator="type")]


class Workload(BaseModel):
    axes: dict[str, Annotated[int, Field(ge=0)]]
    inputs: dict[str, InputSpec] = {}
    uuid: NonEmpty


def _errors(e: ValidationError) -> str:
    lines = []
    for err in e.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        lines.append(f"  {where}: {err['msg'].removeprefix('Value error, ')}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------- finding files


def is_definition_file(path: Path) -> bool:
    """A .json file that is not a task.json and looks like a Definition (has op_type and reference)."""
    if path.suffix != ".json" or not path.is_file() or path.name == "task.json":
        return False
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return "definitions" in path.resolve().parts  # a broken definition: let the loader say what is wrong
    return isinstance(data, dict) and "op_type" in data and "reference" in data


def is_dataset_root(path: Path) -> bool:
    return path.is_dir() and (path / "definitions").is_dir()


def dataset_root_of(definition_path: Path) -> Path:
    """The dataset root above a definition file: the nearest ancestor holding a workloads/ folder."""
    for parent in definition_path.resolve().parents:
        if (parent / "workloads").is_dir():
            return parent
    raise TaskError(f"{definition_path}: no workloads/ folder found above it; a definition is loaded from a "
                    "FlashInfer-Trace dataset (ROOT/definitions/..., ROOT/workloads/...)")


def find_definition(root: Path, name: str) -> Path:
    """ROOT/definitions/**/<name>.json, or the definition file whose "name" is ``name``."""
    folder = root / "definitions"
    if not folder.is_dir():
        raise TaskError(f"{root} is not a FlashInfer-Trace dataset: it has no definitions/ folder")
    by_file = sorted(folder.rglob(f"{name}.json"))
    if by_file:
        return by_file[0]
    for path in sorted(folder.rglob("*.json")):
        try:
            if json.loads(path.read_text()).get("name") == name:
                return path
        except (OSError, ValueError, AttributeError):
            continue
    known = sorted(p.stem for p in folder.rglob("*.json"))
    hint = f" (it has: {', '.join(known[:20])}{' ...' if len(known) > 20 else ''})" if known else " (it has none)"
    raise TaskError(f"{folder} has no definition named {name!r}{hint}")


def load_definition(path: Path) -> tuple[Definition, dict]:
    try:
        raw = json.loads(path.read_text())
    except OSError as e:
        raise TaskError(f"cannot read the definition {path}: {e}") from None
    except ValueError as e:
        raise TaskError(f"{path} is not valid JSON: {e}") from None
    try:
        return Definition.model_validate(raw), raw
    except ValidationError as e:
        raise TaskError(f"{path} is not a valid FlashInfer-Trace definition:\n{_errors(e)}") from None


def load_workloads(root: Path, definition: Definition) -> list[tuple[Workload, dict, str]]:
    """Every workload of ``definition`` under ROOT/workloads, checked against it: (workload, raw, 'file:line')."""
    folder = root / "workloads"
    files = sorted(folder.rglob(f"{definition.name}.jsonl"))
    scan_all = not files  # not named after the definition: look through every workload file for its lines
    if scan_all:
        files = sorted(folder.rglob("*.jsonl"))
    found = []
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
            except ValueError as e:
                if scan_all:
                    continue
                raise TaskError(f"{where} is not valid JSON: {e}") from None
            if not isinstance(record, dict):
                raise TaskError(f"{where}: a workload line must be a JSON object")
            if "workload" in record:  # a workload Trace, the dataset's format
                owner = record.get("definition")
                if owner != definition.name:
                    if scan_all:
                        continue
                    raise TaskError(f"{where}: the line is for definition {owner!r}, not {definition.name!r}")
                raw = record["workload"]
            elif scan_all:
                continue  # a bare workload says nothing about its definition
            else:
                raw = record
            try:
                workload = Workload.model_validate(raw)
            except ValidationError as e:
                raise TaskError(f"{where} is not a valid workload:\n{_errors(e)}") from None
            _check_workload(definition, workload, root, where)
            found.append((workload, raw, where))
    if not found:
        raise TaskError(f"no workloads for definition {definition.name!r} under {folder} "
                        f"(expected workloads/<op_type>/{definition.name}.jsonl)")
    seen: dict[str, str] = {}
    for workload, _, where in found:
        if workload.uuid in seen:
            raise TaskError(f"{where}: workload uuid {workload.uuid} already used at {seen[workload.uuid]}")
        seen[workload.uuid] = where
    return found


def resolve_blob(root: Path, path: str) -> Path:
    p = Path(path)
    return p if p.is_absolute() else (root / p).resolve()


def safetensors_header(path: Path) -> dict:
    """The JSON header of a safetensors file (8-byte little-endian length, then JSON): no package needed."""
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        if size > 100 << 20:
            raise ValueError(f"header of {size} bytes")
        return json.loads(f.read(size))


def _check_workload(definition: Definition, w: Workload, root: Path, where: str) -> None:
    for axis, value in w.axes.items():
        if axis not in definition.axes:
            raise TaskError(f"{where}: axes.{axis} is not an axis of {definition.name} "
                            f"(axes: {', '.join(definition.axes)})")
        const = definition.axes[axis]
        if const.type == "const" and value != const.value:
            raise TaskError(f"{where}: axes.{axis} is {value}, but the definition fixes it at {const.value}")
    missing = [a for a in definition.var_axes if a not in w.axes]
    if missing:
        raise TaskError(f"{where}: axes is missing the variable axes {missing}")
    sizes = {**definition.const_axes, **w.axes}
    for c in definition.constraints:
        try:
            ok = eval(compile(c, "<constraint>", "eval"), {"__builtins__": {}}, dict(sizes))  # noqa: S307
        except Exception:
            continue  # a constraint over more than the axes (e.g. tensor contents) is the reference's to enforce
        if not ok:
            raise TaskError(f"{where}: the workload breaks the definition's constraint `{c}` (axes {w.axes})")
    for name, spec in w.inputs.items():
        if name not in definition.inputs:
            raise TaskError(f"{where}: inputs.{name} is not an input of {definition.name} "
                            f"(inputs: {', '.join(definition.inputs)})")
        tensor = definition.inputs[name]
        if isinstance(spec, ScalarInput) and tensor.shape is not None:
            raise TaskError(f"{where}: inputs.{name} is a scalar, but the definition gives it the shape {tensor.shape}")
        if isinstance(spec, SafetensorsInput):
            path = resolve_blob(root, spec.path)
            if not path.is_file():
                raise TaskError(f"{where}: inputs.{name}.path {spec.path!r} does not exist ({path})")
            try:
                header = safetensors_header(path)
            except (OSError, ValueError, struct.error) as e:
                raise TaskError(f"{where}: inputs.{name}.path {path} is not a safetensors file ({e})") from None
            if spec.tensor_key not in header:
                keys = [k for k in header if k != "__metadata__"]
                raise TaskError(f"{where}: inputs.{name}.tensor_key {spec.tensor_key!r} is not in {path} "
                                f"(it has {keys})")
            expected_shape = [sizes[a] for a in tensor.shape or []]
            entry = header[spec.tensor_key]
            if tensor.shape is not None and list(entry.get("shape", [])) != expected_shape:
                raise TaskError(f"{where}: inputs.{name} in {path} has shape {entry.get('shape')}, "
                                f"the definition expects {expected_shape} for these axes")
            code = DTYPES[tensor.dtype][1]
            if code is not None and entry.get("dtype") != code:
                raise TaskError(f"{where}: inputs.{name} in {path} has dtype {entry.get('dtype')}, "
                                f"the definition expects {tensor.dtype} ({code})")


# ---------------------------------------------------------------------------------------------------- the task folder


def default_tolerance(definition: Definition) -> dict[str, float]:
    tol = dict(EXACT)
    for spec in definition.outputs.values():
        t = TOLERANCE_BY_DTYPE.get(spec.dtype, EXACT)
        tol = {k: max(tol[k], t[k]) for k in tol}
    return tol


def _workload_name(definition: Definition, w: Workload, index: int) -> str:
    axes = "_".join(f"{a}={w.axes[a]}" for a in definition.var_axes if a in w.axes)
    tag = re.sub(r"[^A-Za-z0-9]", "", w.uuid)[:8] or str(index)
    name = f"{axes}_{tag}" if axes else f"w{index}_{tag}"
    return re.sub(r"[^A-Za-z0-9_.=-]", "-", name)  # no commas: names travel comma-separated to the harness


def spread(n: int, k: int) -> list[int]:
    """k indices spread evenly over range(n), first and last included (all of them when n <= k)."""
    if n <= k:
        return list(range(n))
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def _params(definition: Definition, w: Workload, root: Path) -> dict:
    inputs = {}
    for name, spec in w.inputs.items():
        if isinstance(spec, ScalarInput):
            inputs[name] = {"type": "scalar", "value": spec.value}
        elif isinstance(spec, SafetensorsInput):
            inputs[name] = {"type": "safetensors", "path": str(resolve_blob(root, spec.path)),
                            "tensor_key": spec.tensor_key}
    params: dict[str, Any] = {a: w.axes[a] for a in definition.var_axes}
    params.update({a: v for a, v in w.axes.items() if a not in params})
    if inputs:
        params["inputs"] = inputs
    return params


def _choose_language(root: Path, definition: Definition) -> tuple[str, list[str]]:
    """triton, unless the dataset's own solutions for this definition are all in other languages we support."""
    seen: list[str] = []
    folder = root / "solutions"
    if folder.is_dir():
        for path in sorted(folder.rglob("*.json")):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(data, dict) and data.get("definition") == definition.name:
                ours = LANGUAGE_FROM_FLASHINFER.get(str((data.get("spec") or {}).get("language")))
                if ours and ours not in seen:
                    seen.append(ours)
    language = "triton" if not seen or "triton" in seen else seen[0]
    allowed = [language] + [lang for lang in ["triton", "pytorch", *seen] if lang != language]
    return language, list(dict.fromkeys(allowed))


def materialise_definition(source: str | Path, out_dir: str | Path, *, definition: str | None = None,
                           tolerance: dict[str, float] | None = None,
                           max_feedback: int = MAX_FEEDBACK_WORKLOADS) -> Path:
    """Write a task folder for a FlashInfer-Trace definition and return it.

    ``source`` is a definition file (its dataset root is the nearest ancestor with a workloads/ folder), or a dataset
    root with ``definition`` naming the definition. ``tolerance`` ({atol, rtol, matched_ratio}) overrides the
    per-dtype default.
    """
    source = Path(source)
    if source.is_dir():
        if not definition:
            raise TaskError(f"{source} is a FlashInfer-Trace dataset; say which definition: --definition NAME")
        root, path = source.resolve(), find_definition(source.resolve(), definition)
    else:
        if not source.is_file():
            raise TaskError(f"{source} does not exist")
        path = source.resolve()
        root = dataset_root_of(path)
    d, raw = load_definition(path)
    if definition and d.name != definition:
        raise TaskError(f"{path} defines {d.name!r}, not {definition!r}")
    found = load_workloads(root, d)

    names = [_workload_name(d, w, i) for i, (w, _, _) in enumerate(found)]
    for i, name in enumerate(names):  # two workloads with the same axes and uuid prefix
        if names.count(name) > 1:
            names[i] = f"{name}-{i}"
    by_size = sorted(range(len(found)), key=lambda i: (math.prod(found[i][0].axes.values()), i))
    feedback = [names[by_size[j]] for j in spread(len(found), max_feedback)] if len(found) > max_feedback else []
    language, allowed = _choose_language(root, d)
    tol = dict(tolerance) if tolerance else default_tolerance(d)

    spec = {
        "name": d.name,
        "description": (d.description or f"FlashInfer-Trace definition {d.name} ({d.op_type})").strip(),
        "spec": "spec.md",
        "reference": "reference.py",
        "entry_point": "run",
        "entry_kind": "function",
        "language": language,
        "allowed_languages": allowed,
        "solution_file": "kernel.py",
        "tolerance": tol,
        "workloads": [{"name": n, "params": _params(d, w, root)} for n, (w, _, _) in zip(names, found)],
        "feedback_workloads": feedback,
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "task.json").write_text(json.dumps(spec, indent=2) + "\n")
    (out / "spec.md").write_text(spec_markdown(d, spec, [w for w, _, _ in found]))
    (out / "reference.py").write_text(reference_source(d, path))
    meta = {
        "format": 1,
        "definition_file": str(path),
        "dataset_root": str(root),
        "definition": raw,
        "workloads": {n: raw_w for n, (_, raw_w, _) in zip(names, found)},
    }
    (out / META_FILE).write_text(json.dumps(meta, indent=1) + "\n")
    return out


def _shape(spec: TensorSpec) -> str:
    return "scalar" if spec.shape is None else "[" + ", ".join(spec.shape) + "]"


def spec_markdown(d: Definition, task: dict, workloads: list[Workload]) -> str:
    args = ", ".join(d.inputs)
    outs = list(d.outputs)
    returns = f"`{outs[0]}`" if len(outs) == 1 else "the tuple `(" + ", ".join(outs) + ")` (in this order)"
    lines = [f"# {d.name}", "", f"FlashInfer-Trace definition `{d.name}` (op_type `{d.op_type}`)."]
    if d.tags:
        lines.append("Tags: " + ", ".join(f"`{t}`" for t in d.tags) + ".")
    if d.description:
        lines += ["", d.description.strip()]
    lines += [
        "", "## Interface", "",
        f"Write `run({args})` in `{task['solution_file']}`. The inputs arrive in this order, tensors on the GPU "
        "(scalar inputs as Python numbers); return " + returns + ", new tensors with exactly the shapes and dtypes "
        "below. Do not write into the inputs. The result must match the reference below within "
        f"atol={task['tolerance']['atol']:g}, rtol={task['tolerance']['rtol']:g}.",
        "", "## Axes", "", "| axis | kind | size | description |", "|---|---|---|---|",
    ]
    for name, a in d.axes.items():
        size = str(a.value) if a.type == "const" else "varies per workload"
        lines.append(f"| `{name}` | {a.type} | {size} | {(a.description or '').strip()} |")
    for title, tensors in (("Inputs", d.inputs), ("Outputs", d.outputs)):
        lines += ["", f"## {title}", "", "| name | shape | dtype | description |", "|---|---|---|---|"]
        for name, t in tensors.items():
            lines.append(f"| `{name}` | {_shape(t)} | {t.dtype} | {(t.description or '').strip()} |")
    if d.constraints:
        lines += ["", "## Constraints", ""] + [f"- `{c}`" for c in d.constraints]
    lines += ["", "## Workloads", "", f"{len(workloads)} workloads from the dataset."]
    for axis in d.var_axes:
        values = sorted({w.axes[axis] for w in workloads if axis in w.axes})
        shown = ", ".join(map(str, values[:16])) + (" ..." if len(values) > 16 else "")
        lines.append(f"- `{axis}`: {shown}")
    sources = sorted({f"`{n}` ({s.type})" for w in workloads for n, s in w.inputs.items() if s.type != "random"})
    if sources:
        lines.append("Inputs taken from the dataset rather than drawn at random: " + ", ".join(sources) + ".")
    if task["feedback_workloads"]:
        lines.append(f"The search gets feedback on {len(task['feedback_workloads'])} of them, spread over the sizes; "
                     "the final evaluation uses all of them.")
    lines += ["", "## Reference (PyTorch)", "", "```python", d.reference.rstrip(), "```", ""]
    return "\n".join(lines)


_GENERATED = '''

# ---- generated by ksearch (not part of the definition) ----------------------------------------------------------
import torch as _ksearch_torch

_KSEARCH_CONST_AXES = {const_axes!r}
_KSEARCH_INPUTS = {inputs!r}  # (name, shape as axis names or None for a scalar, dtype), in call order
_KSEARCH_OUTPUTS = {outputs!r}
_KSEARCH_BLOBS = {{}}  # safetensors files, loaded once per process (on the CPU)


def _ksearch_dtype(name):
    return getattr(_ksearch_torch, {{"float4_e2m1": "float4_e2m1fn_x2"}}.get(name, name))


def _ksearch_random(shape, dtype_name, g):
    """FlashInfer-Bench's random inputs, drawn from a seeded CPU generator: floats N(0, 1) (fp8/fp4 clamped to
    [-2, 2]), bool 0/1, int8 in [-128, 128), other integers in [0, 1024)."""
    t = _ksearch_torch
    dtype = _ksearch_dtype(dtype_name)
    if dtype_name in ("float32", "float16", "bfloat16"):
        return t.randn(shape, generator=g, dtype=t.float32).to(dtype)
    if dtype_name in ("float8_e4m3fn", "float8_e5m2"):
        return t.randn(shape, generator=g, dtype=t.float32).clamp_(-2.0, 2.0).to(dtype)
    if dtype_name == "float4_e2m1":  # two e2m1 values per byte: random bytes are random pairs
        return t.randint(0, 256, shape, generator=g, dtype=t.uint8).view(dtype)
    if dtype_name == "bool":
        return t.randint(0, 2, shape, generator=g).bool()
    low, high = (-128, 128) if dtype_name == "int8" else (0, 1024)
    return t.randint(low, high, shape, generator=g, dtype=t.int64).to(dtype)


def _ksearch_blob(path, key):
    if path not in _KSEARCH_BLOBS:
        from safetensors.torch import load_file  # the `flashinfer` extra: pip install 'ksearch-graph[flashinfer]'

        _KSEARCH_BLOBS[path] = load_file(path)
    return _KSEARCH_BLOBS[path][key]


def make_inputs(params, seed, device):
    """The inputs of ``run`` for a workload (params: its axes, plus ``inputs`` for scalar and safetensors sources)."""
    sizes = dict(_KSEARCH_CONST_AXES)
    sizes.update({{k: v for k, v in params.items() if k != "inputs"}})
    sources = params.get("inputs") or {{}}
    g = _ksearch_torch.Generator().manual_seed(int(seed))
    out = []
    for name, shape, dtype_name in _KSEARCH_INPUTS:
        source = sources.get(name) or {{"type": "random"}}
        if source["type"] == "scalar":
            out.append(source["value"])
        elif source["type"] == "safetensors":
            out.append(_ksearch_blob(source["path"], source["tensor_key"]).to(device, copy=True))
        elif shape is None:
            out.append(_ksearch_random((), dtype_name, g).item())
        else:
            out.append(_ksearch_random([int(sizes[a]) for a in shape], dtype_name, g).to(device))
    return tuple(out)


def _ksearch_outputs(result):
    """The reference's result as the harness compares it: one tensor, or a tuple in the definition's output order."""
    names = [name for name, _, _ in _KSEARCH_OUTPUTS]
    if isinstance(result, dict):
        result = tuple(result[name] for name in names)
    elif not isinstance(result, (tuple, list)):
        result = (result,)
    if len(result) != len(names):
        raise ValueError(f"run returned {{len(result)}} values, the definition has {{len(names)}} outputs {{names}}")
    tensors = tuple(r if isinstance(r, _ksearch_torch.Tensor) else _ksearch_torch.tensor(r, dtype=_ksearch_dtype(dt))
                    for r, (_, _, dt) in zip(result, _KSEARCH_OUTPUTS))
    return tensors[0] if len(tensors) == 1 else tensors


def reference(*inputs):
    return _ksearch_outputs({run}(*inputs))
'''

_OWN_NAMES = {"make_inputs", "reference"}


def _top_level_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def reference_source(d: Definition, path: Path) -> str:
    """reference.py: the definition's reference verbatim, then make_inputs and the reference wrapper."""
    header = (f'"""Task {d.name}, generated by ksearch from the FlashInfer-Trace definition {path.name}.\n\n'
              f"The definition's reference code comes first, verbatim; make_inputs and reference below are generated.\n"
              f'"""\n\n')
    fields = {
        "const_axes": d.const_axes,
        "inputs": [(n, t.shape, t.dtype) for n, t in d.inputs.items()],
        "outputs": [(n, t.shape, t.dtype) for n, t in d.outputs.items()],
    }
    if _top_level_names(ast.parse(d.reference)) & _OWN_NAMES:
        # The definition uses one of our names itself: run it in a namespace of its own.
        body = (f"_KSEARCH_DEFINITION = {d.reference!r}\n"
                f"_ksearch_namespace = {{'__name__': 'flashinfer_definition'}}\n"
                f"exec(compile(_KSEARCH_DEFINITION, {f'<definition {d.name}>'!r}, 'exec'), _ksearch_namespace)\n")
        return header + body + _GENERATED.format(run="_ksearch_namespace['run']", **fields)
    return header + d.reference.rstrip() + "\n" + _GENERATED.format(run="run", **fields)


# ---------------------------------------------------------------------------------------------------- export


def flashinfer_meta(task: Task) -> dict | None:
    """The original definition and workloads of a task that came from FlashInfer-Trace (None for our own tasks)."""
    path = task.path(META_FILE)
    return json.loads(path.read_text()) if path.is_file() else None


def workload_uuid(task: Task, name: str, params: dict) -> str:
    """A stable uuid for one of our own workloads: the same task and workload always get the same one."""
    key = json.dumps({"task": task.name, "workload": name, "params": params}, sort_keys=True, default=str)
    return str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, "ksearch-workload:" + key))


def trace_workloads(task: Task) -> dict[str, dict]:
    """Our workload name -> a FlashInfer-Trace Workload: the original one, or one made from our params."""
    meta = flashinfer_meta(task)
    if meta:
        return dict(meta["workloads"])
    out = {}
    for w in task.spec.workloads:
        axes = {k: v for k, v in w.params.items() if isinstance(v, int) and not isinstance(v, bool) and v >= 0}
        out[w.name] = {"uuid": workload_uuid(task, w.name, w.params), "axes": axes, "inputs": {}}
    return out


def definition_name(task: Task) -> str:
    meta = flashinfer_meta(task)
    return meta["definition"]["name"] if meta else task.name


def candidate_language(task: Task, files: dict[str, str]) -> str:
    """The FlashInfer-Trace language of an attempt's files."""
    if task.spec.solution_file not in files and any(n.endswith((".cu", ".cpp")) for n in files):
        return "cuda"
    text = files.get(task.spec.solution_file, "")
    if re.search(r"^\s*(import triton|from triton\b)", text, re.M):
        return "triton"
    if task.spec.language == "cuda" and not text:
        return "cuda"
    return "python"


def solution_name(definition: str, row: dict) -> str:
    return f"{definition}__ksearch_{row['source_hash']}"


def solution_json(task: Task, row: dict, files: dict[str, str], *, definition: str, author: str,
                  description: str) -> dict | None:
    """A FlashInfer-Trace Solution for an attempt, or None when its files cannot make one (no entry file)."""
    language = candidate_language(task, files)
    entry_file = "main.cpp" if language == "cuda" else task.spec.solution_file
    sources = [{"path": name, "content": text} for name, text in sorted(files.items())
               if text and not Path(name).is_absolute() and ".." not in Path(name).parts]
    if entry_file not in {s["path"] for s in sources}:
        return None
    result = json.loads(row["result"]) if row.get("result") else {}
    gpu = (result.get("environment") or {}).get("gpu")
    spec: dict[str, Any] = {
        "language": language,
        "target_hardware": [gpu or "cuda"],
        "entry_point": f"{entry_file}::{task.spec.entry_point}",
        "dependencies": [],
        # Our kernels return their outputs; FlashInfer-Bench's default is to pass output tensors in.
        "destination_passing_style": False,
    }
    if language == "cuda":
        spec["binding"] = "torch"  # a torch extension with pybind11 (main.cpp), as the harness builds it
    return {"name": solution_name(definition, row), "definition": definition, "author": author,
            "spec": spec, "sources": sources, "description": description}


def _nan_safe(value: float | None) -> float | str:
    """Correctness errors: FlashInfer-Trace writes an unknown or infinite error as the string "NaN"/"Infinity"."""
    if value is None or math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity"
    return float(value)


def _environment(result: dict) -> dict:
    env = result.get("environment") or {}
    hardware = env.get("gpu") or ("cpu (Triton interpreter)" if env.get("device") == "cpu" else "unknown")
    libs = {k: str(env[k]) for k in ("torch", "triton", "cuda", "cupy", "python", "driver")
            if env.get(k) not in (None, "")}
    return {"hardware": hardware, "libs": libs}


def attempt_traces(task: Task, row: dict, solution: str, workloads: dict[str, dict], definition: str) -> list[dict]:
    """One Trace per workload that this attempt's evaluation decided.

    A passed attempt: every workload it measured, PASSED with correctness and performance. A failed one: the workloads
    measured before the failure PASSED, the one that failed gets the failure status; workloads checked but never timed
    get no trace (there is no verdict for them). A failure before any workload (compile error, timeout, crash on
    import) applies to every workload the evaluation was given, which during the search are the feedback workloads.
    """
    result = json.loads(row["result"])
    status = result.get("status") or row["status"]
    evaluation_base = {
        "environment": _environment(result),
        "timestamp": datetime.fromtimestamp(row.get("created") or 0, timezone.utc).isoformat(),
        "log": (result.get("log_excerpt") or row.get("log_excerpt") or ""),
    }
    rows = result.get("workloads") or []
    timed = [w for w in rows if w.get("correct") and w.get("latency_us") is not None]
    if timed and not result.get("timing_representative", False):
        evaluation_base["log"] = ("timings from a CPU run (Triton interpreter): they order candidates, they are not "
                                  "GPU latencies\n" + evaluation_base["log"]).strip()

    def trace(name: str, ev: dict) -> dict | None:
        if name not in workloads:
            return None
        return {"definition": definition, "workload": workloads[name], "solution": solution,
                "evaluation": {**evaluation_base, **ev}}

    def correctness(w: dict) -> dict:
        abs_error = w.get("max_abs_error")
        if abs_error is None and not w.get("correct"):
            # The harness may give the error of a failed workload only in its message ("max abs error 8.234").
            found = re.search(r"max abs error ([0-9.eE+-]+|inf|nan)", evaluation_base["log"])
            abs_error = float(found.group(1)) if found else None
        return {"max_relative_error": _nan_safe(w.get("max_rel_error")), "max_absolute_error": _nan_safe(abs_error)}

    out = []
    for w in timed:
        perf = {"latency_ms": w["latency_us"] / 1e3,
                "reference_latency_ms": (w.get("reference_us") or 0.0) / 1e3,
                "speedup_factor": w.get("speedup") or 0.0}
        out.append(trace(w["workload"], {"status": "PASSED", "correctness": correctness(w), "performance": perf}))
    if status != "passed" and rows:
        # Correctness runs over every workload before any timing: the culprit is the first wrong one, else (it
        # failed while timed) the first one not timed.
        culprit = next((w for w in rows if not w.get("correct")), None) or next(
            (w for w in rows if w not in timed), None)
        if culprit is not None:
            mapped = STATUS_TO_FLASHINFER.get(status, "RUNTIME_ERROR")
            ev: dict[str, Any] = {"status": mapped}
            if mapped == "INCORRECT_NUMERICAL":
                ev["correctness"] = correctness(culprit)
            out.append(trace(culprit["workload"], ev))
    if status != "passed" and not rows:
        mapped = STATUS_TO_FLASHINFER.get(status, "RUNTIME_ERROR")
        ev = {"status": mapped}
        if mapped == "INCORRECT_NUMERICAL":
            ev["correctness"] = {"max_relative_error": "NaN", "max_absolute_error": "NaN"}
        out += [trace(w.name, ev) for w in task.feedback_workloads()]
    return [t for t in out if t is not None]


def _author(run) -> str:
    config = run.config
    if config.planner != "llm" or config.coder_llm is None:
        return "ksearch (offline planner)"
    return f"ksearch ({config.coder_llm.model})"


def export_flashinfer_trace(run_dir: str | Path, out_dir: str | Path, *, top: int = 1) -> dict[str, list[Path]]:
    """Write a run as a FlashInfer-Trace dataset folder.

    solutions/<name>.json: a Solution for every distinct code the run evaluated (so that no trace names a solution
    that is not there), the run's best ``top`` first in the returned list. traces/<definition>.jsonl: every evaluation
    of the run, one Trace per attempt and workload, failed ones included. definitions/<name>.json: the original
    definition, for a task that came from FlashInfer-Trace. Returns {"best": [...], "solutions": [...],
    "traces": [...], "definitions": [...]} (paths written).
    """
    from .run_dir import RunDir
    from .search import state_at

    run = RunDir.open(run_dir)
    task = run.task()
    best = state_at(run).get("best")
    store = run.store()
    try:
        rows = store.attempts()
        sources = {r["source_hash"]: store.get_source(r["source_hash"]) for r in rows}
    finally:
        store.close()
    out = Path(out_dir)
    meta = flashinfer_meta(task)
    workloads = trace_workloads(task)
    author = _author(run)
    definition = meta["definition"]["name"] if meta else task.name

    written: dict[str, list[Path]] = {"best": [], "solutions": [], "traces": [], "definitions": []}
    solution_of: dict[str, str | None] = {}
    for row in rows:
        digest = row["source_hash"]
        if digest in solution_of:
            continue
        description = (f"K-Search run {run.thread_id}, attempt {row['id']} ({row['prompt_kind']}, world-model node "
                       f"{row['node_id']}): {row['status']}"
                       + (f", score {row['score']:.4g}x" if row["status"] == "passed" else ""))
        sol = solution_json(task, row, sources[digest], definition=definition, author=author,
                            description=description)
        if sol is None:
            solution_of[digest] = None
            continue
        path = out / "solutions" / f"{sol['name']}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(sol, indent=2) + "\n")
        solution_of[digest] = sol["name"]
        written["solutions"].append(path)

    if best:
        passing = [r for r in rows if r["status"] == "passed" and solution_of.get(r["source_hash"])]
        ranked = sorted(passing, key=lambda r: (r["id"] != best["attempt_id"], -r["score"]))
        for r in ranked:
            path = out / "solutions" / f"{solution_of[r['source_hash']]}.json"
            if path not in written["best"]:
                written["best"].append(path)
            if len(written["best"]) >= top:
                break

    lines = []
    for row in rows:
        name = solution_of.get(row["source_hash"])
        if name is None:
            continue  # no entry file among its files: not a Solution FlashInfer-Trace can hold
        lines += [json.dumps(t, allow_nan=False) for t in attempt_traces(task, row, name, workloads, definition)]
    if lines:
        path = out / "traces" / f"{definition}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
        written["traces"].append(path)

    if meta:
        path = out / "definitions" / f"{definition}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(meta["definition"], indent=2) + "\n")
        written["definitions"].append(path)
    return written
