"""The task as both processes use it: its files (task.json, reference.py), its calls, and the seeds of its input
sets."""

from __future__ import annotations

import hashlib
import json
import os
import platform

from ksearch_graph.harness._torch import load_torch
from ksearch_graph.harness.requirements import parse_requires
from ksearch_graph.harness.task_checks import parse_check
from ksearch_graph.harness.writable import parse_writable


def derive_seed(base: int, *parts) -> int:
    digest = hashlib.sha256(":".join(str(p) for p in (base, *parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def prepare(entry, inputs: tuple, kind: str, device: str):
    """(callable, arguments) for one call. ``module`` kind: inputs are (init_args, state_dict, *forward_inputs)."""
    if kind == "function":
        return entry, inputs
    init_args, state, *forward = inputs
    model = entry(*init_args).to(device)
    model.load_state_dict(state, strict=True)
    return model, tuple(forward)


# --- timing -------------------------------------------------------------------------------------------------------


# task.json's defaults, the one place they are written: the judge reads task.json with these (it imports no pydantic)
# and TaskSpec (tasks/task.py) takes its field defaults from here.
TASK_DEFAULTS = {
    "reference": "reference.py",
    "solution_file": "kernel.py",
    "language": "triton",
    "entry_kind": "function",
    "correctness_seeds": 3,
    "baseline": None,
    "timing": "device",  # or "end_to_end" (Timer.end_to_end)
    "compare_dtype": None,  # e.g. "float32" (compare.compare's as_dtype)
    "input_source": "task",  # or "gpumode" (Judge.correctness_seed)
}
TOLERANCE_DEFAULTS = {"atol": 1e-5, "rtol": 1e-5, "matched_ratio": 1.0}
WORKLOAD_TIMED_DEFAULT = True


def read_task(task_dir: str, only: list[str] | None) -> dict:
    with open(os.path.join(task_dir, "task.json")) as f:
        task = json.load(f)
    for key, value in TASK_DEFAULTS.items():
        task.setdefault(key, value)
    where = os.path.join(task_dir, "task.json")
    task["check"] = parse_check(task.get("check"), where)  # the task's own check (task_checks.run_check) or None
    task["writable_inputs"] = parse_writable(task.get("writable_inputs"), where)  # output buffers (writable.py)
    task["requires"] = parse_requires(task.get("requires"), where)  # what the machine needs (requirements.py)
    task["tolerance"] = TOLERANCE_DEFAULTS | task.get("tolerance", {})
    for w in task["workloads"]:
        w.setdefault("timed", WORKLOAD_TIMED_DEFAULT)
    if only:
        unknown = sorted(set(only) - {w["name"] for w in task["workloads"]})
        if unknown:
            raise ValueError(f"--workloads names unknown workloads {unknown}")
        task["workloads"] = [w for w in task["workloads"] if w["name"] in only]
    return task


def candidate_form(task: dict, root: str) -> str:
    """python (Triton, PyTorch, CuPy: one Python file) or torch_extension (CUDA C++ sources and main.cpp)."""
    if os.path.isfile(os.path.join(root, task["solution_file"])):
        return "python"
    if any(n.endswith((".cu", ".cpp")) for n in os.listdir(root)) and "cuda" in (
            task.get("allowed_languages") or [task["language"]]):
        return "torch_extension"
    return "python"  # and the runner reports the missing solution file


def timings_key(task_dir: str, task: dict, device: str) -> str:
    """What reference and baseline timings depend on besides the workload: the task's code, the GPU, the versions.
    Timings passed in under another key (the task was edited, another GPU) are measured again."""
    digest = hashlib.sha256()
    for rel in (task["reference"], task["baseline"]):
        if rel:
            with open(os.path.join(task_dir, rel), "rb") as f:
                digest.update(f.read() + b"\0")
    torch = load_torch()
    gpu = str(torch.cuda.get_device_properties(0).uuid) if device == "cuda" else platform.node()
    digest.update(f"{gpu}:{torch.__version__}:{device}:{task['timing']}".encode())
    return digest.hexdigest()[:32]
