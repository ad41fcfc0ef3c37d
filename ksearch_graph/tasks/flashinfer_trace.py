"""FlashInfer-Trace datasets: the schema of a Definition and its workloads, and finding, reading and checking them.

A dataset (the public ``flashinfer-trace`` layout):

    ROOT/definitions/<op_type>/<name>.json     a Definition
    ROOT/workloads/<op_type>/<name>.jsonl      its workloads, one per line: a workload Trace
                                               {"definition": name, "workload": {uuid, axes, inputs}, ...}
                                               (a bare {uuid, axes, inputs} line is accepted too)
    ROOT/blob/...                              safetensors files that workload inputs point at

Everything is checked on the way in; a malformed file is a ``TaskError`` that names the file, the line and the field.
The schema follows ``flashinfer_bench.data`` 0.1.2 (checked against its pydantic models); flashinfer-bench itself is
not needed here. ``flashinfer_trace_task`` turns a definition into a task folder; ``flashinfer_trace_export`` writes a
run back as a dataset.
"""

from __future__ import annotations

import ast
import json
import struct
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from ksearch_graph.tasks.task import TaskError

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

# ---------------------------------------------------------------------------------------------------- the schema

NonEmpty = Annotated[str, Field(min_length=1)]


class Axis(BaseModel):
    type: Literal["const", "var"]
    value: int | None = Field(None, ge=0)
    description: str | None = None

    @model_validator(mode="after")
    def _const_has_value(self) -> Axis:
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

    @field_validator("constraints", mode="before")
    @classmethod
    def _none_is_empty(cls, v):  # flashinfer-bench 0.1.1 wrote "constraints": null for a definition without any
        return [] if v is None else v

    @model_validator(mode="after")
    def _consistent(self) -> Definition:
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


InputSpec = Annotated[RandomInput | ScalarInput | SafetensorsInput, Field(discriminator="type")]


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
    missing: list[Path] = []  # safetensors files the workloads name and the dataset lacks
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
            _check_workload(definition, workload, root, where, missing)
            found.append((workload, raw, where))
    if not found:
        raise TaskError(f"no workloads for definition {definition.name!r} under {folder} "
                        f"(expected workloads/<op_type>/{definition.name}.jsonl)")
    if missing:
        raise TaskError(missing_blobs_message(definition.name, root, missing))
    seen: dict[str, str] = {}
    for workload, _, where in found:
        if workload.uuid in seen:
            raise TaskError(f"{where}: workload uuid {workload.uuid} already used at {seen[workload.uuid]}")
        seen[workload.uuid] = where
    return found


LFS_POINTER = b"version https://git-lfs.github.com/spec/v1"
HF_DATASET = "flashinfer-ai/flashinfer-trace"  # the public dataset on the Hugging Face Hub


def is_lfs_pointer(path: Path) -> bool:
    """A Git LFS pointer checked out in place of the file (a clone without ``git lfs pull``)."""
    try:
        with open(path, "rb") as f:
            return f.read(len(LFS_POINTER)) == LFS_POINTER
    except OSError:
        return False


def missing_blobs_message(definition: str, root: Path, missing: list[Path]) -> str:
    """The blob files a definition's workloads need and the dataset lacks, and how to fetch them."""
    shown = [str(p.relative_to(root)) if p.is_relative_to(root) else str(p) for p in missing]
    folders = sorted({str(Path(p).parent) for p in shown})
    patterns = " ".join(f"'{f}/*'" for f in folders[:4]) + (" ..." if len(folders) > 4 else "")
    lfs = sum(is_lfs_pointer(p) for p in missing)
    listing = ", ".join(shown[:3]) + (f" and {len(shown) - 3} more" if len(shown) > 3 else "")
    return (f"{len(missing)} input file{'s' if len(missing) > 1 else ''} of definition {definition!r} "
            f"{'are' if len(missing) > 1 else 'is'} missing from the dataset at {root}"
            + (f" ({lfs} of them Git LFS pointers, not the files)" if lfs else "") + f": {listing}. FlashInfer-Trace "
            f"keeps its blob files in Git LFS: in a git clone of the dataset run `git lfs pull --include "
            f"{','.join(folders[:4])}`, or fetch them from the Hugging Face Hub: `huggingface-cli download "
            f"{HF_DATASET} --repo-type dataset --local-dir {root} --include {patterns}`")


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


def _check_workload(definition: Definition, w: Workload, root: Path, where: str, missing: list[Path]) -> None:
    for axis, value in w.axes.items():
        if axis not in definition.axes:
            raise TaskError(f"{where}: axes.{axis} is not an axis of {definition.name} "
                            f"(axes: {', '.join(definition.axes)})")
        const = definition.axes[axis]
        if const.type == "const" and value != const.value:
            raise TaskError(f"{where}: axes.{axis} is {value}, but the definition fixes it at {const.value}")
    absent = [a for a in definition.var_axes if a not in w.axes]
    if absent:
        raise TaskError(f"{where}: axes is missing the variable axes {absent}")
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
            if not path.is_file() or is_lfs_pointer(path):
                if path not in missing:
                    missing.append(path)
                continue
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
