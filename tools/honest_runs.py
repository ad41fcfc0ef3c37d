"""Honest candidates evaluated many times: how often the judge flags one (it must never).

    python tools/honest_runs.py [--evaluations 200] [--parallel 2] [--out DIR] [PAIR ...]

A PAIR is TASK_FOLDER:CANDIDATE_FILE (default: the softmax example's seed and the cheat task's honest candidate, the
example tasks a CPU machine runs). The evaluations go round the pairs, ``--parallel`` at a time (on CPU, two at a
time load a two-core host the way a search with two lanes does; on a GPU use 1). Prints the count per status and
every evaluation that did not pass, and writes honest_runs.json.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_PAIRS = ["examples/softmax:examples/softmax/seed.py", "tests/cheats/task:tests/cheats/honest.py"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("pairs", nargs="*", default=DEFAULT_PAIRS)
    p.add_argument("--evaluations", type=int, default=200)
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--budget-s", type=float, default=None, help="timing budget per workload (default: the harness's)")
    p.add_argument("--out", default=".")
    args = p.parse_args()
    from ksearch_graph.harness.parent.client import SubprocessEvaluator
    from ksearch_graph.tasks.task import load_task

    jobs = []
    for pair in args.pairs:
        folder, candidate = pair.split(":")
        task = load_task(ROOT / folder)
        jobs.append((folder, task, {task.spec.solution_file: (ROOT / candidate).read_text()}))
    kwargs = {"timeout_s": 300} | ({"time_budget_s": args.budget_s} if args.budget_s else {})
    evaluators = [SubprocessEvaluator(**kwargs) for _ in range(args.parallel)]

    def run(i: int) -> dict:
        folder, task, files = jobs[i % len(jobs)]
        r = evaluators[i % args.parallel].evaluate(task, files, attempt_id=f"honest-{i}")
        row = {"task": folder, "status": r.status.value, "wall_s": round(r.wall_s, 2),
               "log": r.log_excerpt[:400] if not r.passed else ""}
        # One line per evaluation as it ends: a run cut short by a time limit keeps what it measured.
        print(json.dumps({"i": i, **row}), flush=True)
        return row

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        results = list(pool.map(run, range(args.evaluations)))
    for e in evaluators:
        e.close()
    counts = collections.Counter(r["status"] for r in results)
    report = {"date": time.strftime("%Y-%m-%d"), "evaluations": len(results), "parallel": args.parallel,
              "seconds": round(time.perf_counter() - t0, 1), "counts": dict(counts), "pairs": args.pairs,
              "not_passed": [r for r in results if r["status"] != "passed"]}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "honest_runs.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "not_passed"}, indent=1))
    for r in report["not_passed"]:
        print(f"  {r['task']}: {r['status']}: {r['log']}")
    return 0 if counts.get("suspicious", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
