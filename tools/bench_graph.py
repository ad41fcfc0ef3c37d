"""Measure the graph's own overhead per iteration and the run directory's growth per iteration.

    python tools/bench_graph.py --iterations 50 [--evaluator real|instant] [--task examples/softmax]

Overhead = wall time of the whole run minus the time spent inside the evaluator, the coder and the
planner (all recorded per call). With ``--evaluator instant`` candidates are scored without running
them (a deterministic function of the template parameters), which isolates the graph, checkpointer
and store; ``real`` runs every candidate through the subprocess harness. Storage is sampled after
every evaluated attempt: checkpoints.sqlite and store.sqlite including their WAL files.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ksearch_graph.app.runs import drive, start  # noqa: E402
from ksearch_graph.config import Budget, SearchConfig  # noqa: E402
from ksearch_graph.search.context import make_context  # noqa: E402
from ksearch_graph.search.roles.offline import params_of  # noqa: E402
from ksearch_graph.tasks.evaluation import EvalResult, Status  # noqa: E402


class InstantEvaluator:
    """Scores a template instance from its parameters; fails single_pass with a short block."""

    def evaluate(self, task, files, *, attempt_id):
        p = params_of(files)
        if p.get("VARIANT") == "single_pass" and p.get("BLOCK_N", 0) < 4096:
            return EvalResult(status=Status.incorrect_numerical, log_excerpt="max abs error 0.9 at [0, 300]")
        score = p.get("BLOCK_N", 256) / 256 * p.get("ROWS_PER_PROGRAM", 1) ** 0.5 / (1 + abs(p.get("NUM_WARPS", 4) - 4) / 8)
        return EvalResult(status=Status.passed, score=score, latency_us=100 / score)


def dir_bytes(run_dir: Path) -> dict[str, int]:
    """Bytes of both databases with their WAL folded in (the WAL is a bounded journal, not growth)."""
    def size(name: str) -> int:
        with sqlite3.connect(str(run_dir / name)) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return sum(p.stat().st_size for p in run_dir.glob(name + "*") if p.is_file())

    return {"checkpoints": size("checkpoints.sqlite"), "store": size("store.sqlite")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--evaluator", choices=["instant", "real"], default="instant")
    ap.add_argument("--task", default=str(Path(__file__).resolve().parent.parent / "examples" / "softmax"))
    ap.add_argument("--out", help="write the samples as JSON here")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        run = start(args.task, Path(tmp) / "run", SearchConfig(budget=Budget(iterations=args.iterations)))
        ctx = make_context(run, evaluator=InstantEvaluator() if args.evaluator == "instant" else None)
        samples = []
        sampling = 0.0  # time spent measuring, taken out of the overhead
        t0 = time.perf_counter()

        def on_event(event: dict) -> None:
            nonlocal sampling
            if event.get("event") == "attempt" and event.get("prompt_kind") != "seed":
                t = time.perf_counter()
                samples.append({"iteration": event["iteration"], "t": t - t0, **dir_bytes(run.path)})
                sampling += time.perf_counter() - t

        drive(run, ctx, fresh=True, on_event=on_event)
        wall = time.perf_counter() - t0 - sampling
        attempts = ctx.store.attempts()
        inside = sum(a["eval_s"] + a["codegen_s"] for a in attempts)
        planner = ctx.store.db.execute("select coalesce(sum(seconds),0) from llm_calls where role='planner'").fetchone()[0]
        n = len([a for a in attempts if a["prompt_kind"] != "seed"])
        final = dir_bytes(run.path)
        total = final["checkpoints"] + final["store"]
        half = next(s for s in samples if s["iteration"] >= n // 2)
        report = {
            "iterations": n,
            "evaluator": args.evaluator,
            "wall_s": round(wall, 3),
            "evaluator_and_coder_s": round(inside, 3),
            "planner_s": round(planner, 3),
            "graph_overhead_ms_per_iteration": round(1000 * (wall - inside - planner) / n, 2),
            "bytes_total": total,
            "bytes_per_iteration": round(total / n),
            "bytes_per_iteration_first_half": round((half["checkpoints"] + half["store"]) / half["iteration"]),
            "bytes_per_iteration_second_half": round(
                (total - half["checkpoints"] - half["store"]) / (n - half["iteration"])) if n > half["iteration"] else None,
            "final": final,
        }
        print(json.dumps(report, indent=2))
        if args.out:
            Path(args.out).write_text(json.dumps({"report": report, "samples": samples}, indent=2))


if __name__ == "__main__":
    main()
