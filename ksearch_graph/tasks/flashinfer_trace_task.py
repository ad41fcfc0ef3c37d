"""A FlashInfer-Trace definition and its workloads become a task folder.

``materialise_definition(path, out_dir)`` reads a definition from a FlashInfer-Trace dataset (``flashinfer_trace``)
and writes a task folder that ``load_task`` loads: ``task.json``, ``spec.md`` (generated from the definition),
``reference.py`` (the definition's reference verbatim plus a generated ``make_inputs``) and ``flashinfer_trace.json``
(the original definition and workloads, which the export uses to write traces against the original names and uuids).
"""

from __future__ import annotations

import ast
import json
import math
import re
from pathlib import Path
from typing import Any

from ksearch_graph.tasks.flashinfer_trace import (
    Definition,
    SafetensorsInput,
    ScalarInput,
    TensorSpec,
    Workload,
    dataset_root_of,
    find_definition,
    load_definition,
    load_workloads,
    resolve_blob,
)
from ksearch_graph.tasks.task import TaskError

META_FILE = "flashinfer_trace.json"
MAX_FEEDBACK_WORKLOADS = 8

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

# FlashInfer-Trace's SupportedLanguages (python, triton, cpp, cuda, tilelang) -> our language names.
LANGUAGE_FROM_FLASHINFER = {"triton": "triton", "python": "pytorch", "cuda": "cuda"}


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
    """Triton, what the coder writes by default; accepted besides it: PyTorch and the languages of the dataset's own
    solutions for the definition (a CUDA solution makes CUDA candidates acceptable, not the task a CUDA task: one
    solution says what someone wrote, not what the task needs)."""
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
    return "triton", list(dict.fromkeys(["triton", "pytorch", *seen]))


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
    import os as _os

    if not _os.path.isabs(path):  # carried with the task (a Ray worker's copy): relative to this folder
        path = _os.path.join(_os.path.dirname(_os.path.abspath(globals().get("__file__", "."))), path)
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

