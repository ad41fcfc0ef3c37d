"""Export a run's best kernel(s) as plain files, each with a small ``result.json`` that says what it scored.

``export_best(run_dir, out_dir)`` writes the run's best kernel into ``out_dir``; with ``top=k`` it writes the k
best distinct passing kernels, each into ``out_dir/<attempt id>/``, the run's best first. ``result.json`` says how
far the kernel is from its speed-of-light floor; an LLM run also gets each kernel's ``prompt.json`` (the prompt
that produced its code, and the raw answer) and ``out_dir/llm_exchanges.jsonl.gz``, every prompt and answer of the run.

``export_best(..., format="flashinfer-trace")`` (``ksearch export DIR --format flashinfer-trace``) writes the run as
a FlashInfer-Trace dataset folder instead: ``OUT/solutions/<name>.json`` (one Solution per distinct evaluated code,
the best ones included), ``OUT/traces/<definition>.jsonl`` (every evaluation, failed ones too) and, for a task that
came from FlashInfer-Trace, ``OUT/definitions/<name>.json``; see ``flashinfer_trace_export.export_flashinfer_trace``.
"""

from __future__ import annotations

import functools
import gzip
import json
from pathlib import Path

from ksearch_graph.harness.parent.client import write_files
from ksearch_graph.reports.run_view import state_at
from ksearch_graph.rundir.integrity import open_for_reading
from ksearch_graph.tasks.evaluation import EvalResult
from ksearch_graph.tasks.speed_of_light import Fractions, row_fractions, run_work
from ksearch_graph.tasks.task import Task

RESULT_FILE = "result.json"
PROMPT_FILE = "prompt.json"  # the exchange(s) that produced a kernel's code
EXCHANGES_FILE = "llm_exchanges.jsonl.gz"  # every prompt and raw answer of the run


FORMATS = ("files", "flashinfer-trace")


def export_best(run_dir: str | Path, out_dir: str | Path, *, top: int = 1, format: str = "files") -> list[Path]:
    """Write the best kernel (or the ``top`` best) and return the folders written, best first.

    "Best" is the run's own best (the search's choice, made with its noise margin and confirming
    re-measurement); the others follow by score. Attempts with the same code count once.
    With ``format="flashinfer-trace"`` the whole run is written as FlashInfer-Trace (see ``export_flashinfer``) and
    the best Solution files are returned, best first.
    """
    if top < 1:
        raise ValueError("top must be at least 1")
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, not {format!r}")
    if format == "flashinfer-trace":
        return export_flashinfer(run_dir, out_dir, top=top)["best"]
    run = open_for_reading(run_dir)
    best = state_at(run).get("best")
    if not best:
        return []
    store = run.store()
    task = run.task()
    try:
        passing = [a for a in store.attempts() if a["status"] == "passed"]
        ranked = sorted(passing, key=lambda a: (a["id"] != best["attempt_id"], -a["score"]))
        chosen, hashes = [], set()
        for row in ranked:
            if row["source_hash"] not in hashes:
                hashes.add(row["source_hash"])
                chosen.append((row, store.get_source(row["source_hash"])))
        chosen = chosen[:top]
        work = functools.cache(lambda: run_work(store, task, save=False))
        extras = [(row_fractions(row, work), store.exchanges(f"{row['id']}:code")) for row, _ in chosen]
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_exchanges(store, out / EXCHANGES_FILE)
    finally:
        store.close()
    folders = [out] if top == 1 else [out / row["id"] for row, _ in chosen]
    return [write_kernel(folder, task, row, files, fractions=fr, exchanges=ex)
            for folder, (row, files), (fr, ex) in zip(folders, chosen, extras)]


def export_flashinfer(run_dir: str | Path, out_dir: str | Path, *, top: int = 1) -> dict[str, list[Path]]:
    """The run as a FlashInfer-Trace folder: {"best", "solutions", "traces", "definitions"} -> paths written."""
    from ksearch_graph.reports.flashinfer_trace_export import export_flashinfer_trace

    written = export_flashinfer_trace(run_dir, out_dir, top=top)
    store = open_for_reading(run_dir).store()
    try:
        write_exchanges(store, Path(out_dir) / EXCHANGES_FILE)
    finally:
        store.close()
    return written


def write_exchanges(store, path: Path) -> None:
    """Every prompt and raw answer of the run, one recorded call per line (gzip JSON lines); nothing for a run that
    recorded none."""
    exchanges = store.exchanges()
    if exchanges:
        path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(path, "wt", encoding="utf-8") as f:
            for e in exchanges:
                f.write(json.dumps(e, ensure_ascii=False) + "\n")


def write_kernel(folder: Path, task: Task, row: dict, files: dict[str, str], *, fractions: Fractions | None = None,
                 exchanges: list[dict] | None = None) -> Path:
    """One kernel's files, its ``result.json`` (with its fraction of the speed-of-light floor) and, when the run
    recorded it, ``prompt.json``: the prompt that produced the code and the raw answer."""
    folder.mkdir(parents=True, exist_ok=True)
    # The file names came from the coder (an LLM): write_files refuses any that would leave the folder.
    write_files(folder, files)
    result = EvalResult.model_validate_json(row["result"])
    summary = {
        "task": task.name,
        "attempt_id": row["id"],
        "node_id": row["node_id"],
        "status": row["status"],
        "score": row["score"],
        "latency_us": row["latency_us"],
        "timing_representative": result.timing_representative,
        "workloads": [w.model_dump(mode="json") for w in result.workloads],
        "environment": result.environment,
        "speed_of_light": fractions.as_dict() if fractions else None,
        "files": sorted(files),
    }
    (folder / RESULT_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    if exchanges:
        (folder / PROMPT_FILE).write_text(json.dumps(exchanges, indent=1, ensure_ascii=False) + "\n")
    return folder
