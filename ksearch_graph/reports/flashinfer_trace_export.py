"""A run becomes FlashInfer-Trace Solutions and Traces.

``export_flashinfer_trace(run_dir, out_dir)`` writes ``OUT/solutions/<name>.json`` and
``OUT/traces/<definition>.jsonl`` (and, for a task that came from FlashInfer-Trace, ``OUT/definitions/<name>.json``),
so that OUT loads as a FlashInfer-Trace dataset (``flashinfer_bench.TraceSet.from_path``).
"""

from __future__ import annotations

import json
import math
import re
import uuid as uuidlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ksearch_graph.tasks.flashinfer_trace_task import META_FILE
from ksearch_graph.tasks.task import Task

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
        "timestamp": datetime.fromtimestamp(row.get("created") or 0, UTC).isoformat(),
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
    from ksearch_graph.reports.run_view import state_at
    from ksearch_graph.rundir.integrity import open_for_reading

    run = open_for_reading(run_dir)
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
