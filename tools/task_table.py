"""Reference, baseline and seed-solution latency per workload of one or more tasks, through the real harness.

    python tools/task_table.py examples/gqa_paged_decode_h32_kv4_d128_ps1 [...] [--workloads feedback|all] [--out F.md]

Each task's seed solution is evaluated once (a fresh judge and candidate process, as in a search); the harness times
the reference and the task's baseline in the same evaluation, the same way. Prints a markdown table per task.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ksearch_graph.harness.parent.client import SubprocessEvaluator  # noqa: E402
from ksearch_graph.tasks.task import load_task  # noqa: E402


def table(task_dir: str, workloads: str, budget_s: float) -> str:
    task = load_task(task_dir)
    files = {task.spec.solution_file: task.seed_source} if task.seed_source else None
    if files is None:
        return f"## {task.name}\n\nno seed solution to evaluate\n"
    ev = SubprocessEvaluator(timeout_s=1200, compile_timeout_s=600, call_timeout_s=300, workloads=workloads,
                             time_budget_s=budget_s)
    r = ev.evaluate(task, files, attempt_id=f"table-{task.name}")
    lines = [f"## {task.name}", "",
             f"{r.environment.get('gpu') or 'CPU'}, torch {r.environment.get('torch')}, "
             f"triton {r.environment.get('triton')}, {time.strftime('%Y-%m-%d')}; seed solution: {r.status.value} "
             f"(evaluation wall {r.wall_s:.1f} s)", ""]
    if not r.passed:
        lines.append("```\n" + r.log_excerpt + "\n```")
    lines += ["| workload | reference us | baseline us | seed us | seed vs reference | seed vs baseline |",
              "| --- | --- | --- | --- | --- | --- |"]
    fmt = lambda v, f="{:.1f}": "-" if v is None else f.format(v)  # noqa: E731
    for w in r.workloads:
        if not w.timed:
            continue
        lines.append(f"| {w.workload} | {fmt(w.reference_us)} | {fmt(w.baseline_us)} | {fmt(w.latency_us)} | "
                     f"{fmt(w.speedup, '{:.2f}x')} | {fmt(w.speedup_vs_baseline, '{:.2f}x')} |")
    if r.passed:
        lines += ["", f"Seed: geometric-mean speedup {r.score:.3f}x vs reference"
                  + (f", {r.speedup_vs_baseline:.3f}x vs baseline, score {r.baseline_score:.1f}"
                     if r.baseline_score is not None else "")]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tasks", nargs="+")
    p.add_argument("--workloads", choices=["feedback", "all"], default="feedback")
    p.add_argument("--time-budget-s", type=float, default=1.0)
    p.add_argument("--out")
    args = p.parse_args()
    text = ""
    for t in args.tasks:
        part = table(t, args.workloads, args.time_budget_s)
        print(part, flush=True)
        text += part + "\n"
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
