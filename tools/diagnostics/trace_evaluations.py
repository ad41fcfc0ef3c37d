"""Evaluate one solution of a task several times with every timed call traced, for offline study of the timing.

    python tools/diagnostics/trace_evaluations.py [TASK_DIR] [--solution FILE] [--name NAME] [--evaluations N] [--budget-s S]
                                      --out DIR

Writes DIR/trace.jsonl (the judge's timing trace: one line per burst of timed calls, the candidate's and the
reference's, each call's device us, tail us, probe us and host us, ``at`` the wall clock when the judge had them,
``dropped`` where the side-stream rule dropped it; an ``evaluation`` field added here) and DIR/results.json (each
evaluation's result as the harness returns it). Exits 1 unless every evaluation passed. What a stopping rule
would have reported had it stopped after fewer bursts can be read from the trace: run with a large ``--budget-s`` to
let bursts pile up. Default task: examples/trimul with its seed submission. ``traced_evaluations`` is also the
self-test's calibration loop (gpu_selftest.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def traced_evaluations(task, files: dict, evaluations: int, budget_s: float, label: str, timeout_s: float = 900):
    """Evaluate ``files`` ``evaluations`` times in fresh processes, the reference timed in each, every timed call
    traced by the judge: yields (result, [the trace's lines of that evaluation, as dicts]). The evaluator is closed
    and the trace turned off once the last is yielded (its prestarted processes would share the GPU with whatever
    runs next)."""
    from ksearch_graph.harness.judge.session import TRACE_ENV
    from ksearch_graph.harness.parent.client import SubprocessEvaluator

    trace = Path(tempfile.mkdtemp()) / "trace.jsonl"
    trace.touch()
    os.environ[TRACE_ENV] = str(trace)  # before the evaluator: its prestarted processes inherit it
    try:
        evaluator = SubprocessEvaluator(timeout_s=timeout_s, workloads="all", time_budget_s=budget_s,
                                        reuse_reference_timings_s=0)
        try:
            lines_read = 0
            for i in range(evaluations):
                r = evaluator.evaluate(task, files, attempt_id=f"{label}-{i}")
                lines = trace.read_text().splitlines()
                yield r, [json.loads(line) for line in lines[lines_read:]]
                lines_read = len(lines)
        finally:
            evaluator.close()
    finally:
        del os.environ[TRACE_ENV]


def main(argv: list[str] | None = None) -> int:
    from ksearch_graph.tasks.task import load_task

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("task", nargs="?", default=str(ROOT / "examples" / "trimul"))
    p.add_argument("--solution", help="the candidate's file (default: the task's seed solution)")
    p.add_argument("--name", help="the candidate's file name as the harness sees it (default: the task's)")
    p.add_argument("--evaluations", type=int, default=3)
    p.add_argument("--budget-s", type=float, default=1.0, help="each workload's timing budget")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.evaluations < 1 or not 0 < args.budget_s < float("inf"):
        p.error("--evaluations needs at least 1 and --budget-s a positive number of seconds")

    task = load_task(args.task)
    source = Path(args.solution).read_text() if args.solution else task.seed_source
    if source is None:
        p.error(f"{args.task} has no seed solution: name one with --solution")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    files = {args.name or task.spec.solution_file: source}
    results = []
    with open(out / "trace.jsonl", "w") as kept:
        for i, (r, lines) in enumerate(traced_evaluations(task, files, args.evaluations, args.budget_s, "trace")):
            print(f"evaluation {i + 1}: {r.status.value}, wall {r.wall_s:.1f} s, score {r.score}", flush=True)
            results.append(json.loads(r.model_dump_json()))
            kept.writelines(json.dumps({"evaluation": i, **line}) + "\n" for line in lines)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    return 0 if results and all(r["status"] == "passed" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
