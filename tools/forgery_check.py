"""Timing that candidate code cannot forge, checked on one host (the GPU host: the H200): one call, one table.

    python tools/forgery_check.py [--skip-tests] [--skip-trimul] [--out DIR]

1. pytest over tests/test_forgery.py (the planted forgeries: every one must be suspicious; the honest candidate
   passes) and tests/test_time_bound.py, GPU tests included.
2. Honest candidates, each evaluated with a timing trace: the cheat task's honest candidate, the softmax example's
   seed and (unless --skip-trimul) TriMul's seed, all workloads. Per timed workload: status, mean latency, and the
   judge's bound (harness/judge/time_bound.py) on its bursts: the device floor the judge's clock leaves per call (the
   burst's quantile of its calls' floors), the median reported time, the threshold a forgery must stay under, and
   floor / threshold (below 1: passes; the closer to 1, the tighter the bound for that call length); a burst the
   judge dropped and timed again (its clock or the side-stream rule) is marked.
3. The guards' own cost in this process (harness/candidate/forgery.py): the integrity check per timed call, without and with
   the audit hook, and the hook's cost per audit event (a function's ``__code__`` read, the commonest event in the
   harness's own checks).
Compare the latencies with BENCHMARKS.md's last figures (TriMul's seed: its geomean and per-workload means); run
tools/gpu_selftest.py for the calibration kernels' precision. Writes forgery_check.json into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run_tests() -> int:
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "", "tests/test_forgery.py", "tests/test_time_bound.py"]
    print("$", " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=ROOT).returncode


def bound_rows(trace: Path) -> list[dict]:
    from ksearch_graph.harness.judge import time_bound as tb

    rows = []
    for line in trace.read_text().splitlines() if trace.exists() else []:
        entry = json.loads(line)
        bound = entry.get("bound")
        if entry.get("who") != "candidate" or not bound:
            continue
        said = [call[0] for call in entry["calls"]]
        cal = tb.Calibration(bound["overhead_us"], bound["noise_us"], 0.0, bound["rel_slack"], bound["quantile"],
                             bound.get("overhead_slack", tb.POLICY.bound_overhead_slack))
        floors = [tb.device_floor_us(s, cal) for s in bound["spans_us"]]
        rows.append({"workload": entry["workload"], "first": entry["first"], "said_us": statistics.median(said),
                     "floor_us": tb.quantile(floors, cal.quantile),
                     "threshold_us": tb.threshold_us(statistics.median(said), cal),
                     "overhead_us": cal.overhead_us, "noise_us": cal.noise_us,
                     "dropped": bool(entry.get("dropped"))})  # not in the result (timed again)
    return rows


def evaluate(label: str, task_dir: Path, files: dict, workloads: str | None = None) -> dict:
    from ksearch_graph.harness.parent.client import SubprocessEvaluator
    from ksearch_graph.tasks.task import load_task

    trace = Path(tempfile.mkdtemp(prefix="kfc-")) / "trace.jsonl"
    os.environ["KSEARCH_TIMING_TRACE"] = str(trace)
    try:
        ev = SubprocessEvaluator(timeout_s=900, time_budget_s=1.0, **({"workloads": workloads} if workloads else {}))
        r = ev.evaluate(load_task(task_dir), files, attempt_id=f"forgery-check-{label}")
        ev.close()
    finally:
        os.environ.pop("KSEARCH_TIMING_TRACE", None)
    rows = bound_rows(trace)
    print(f"\n{label}: {r.status.value}, geomean latency {r.latency_us} us, score {r.score:.4g}")
    if r.status.value != "passed":
        print(r.log_excerpt[:1500])
    print(f"  {'workload':28s} {'burst':>5s} {'reported':>10s} {'floor':>10s} {'threshold':>10s} {'floor/thr':>9s} "
          f"{'overhead':>9s} {'noise':>7s} dropped")
    for row in rows:
        print(f"  {row['workload'][:28]:28s} {row['first']:5d} {row['said_us']:10.1f} {row['floor_us']:10.1f} "
              f"{row['threshold_us']:10.1f} {row['floor_us'] / row['threshold_us']:9.2f} {row['overhead_us']:9.1f} "
              f"{row['noise_us']:7.1f} {'yes' if row['dropped'] else ''}")
    return {"label": label, "status": r.status.value, "latency_us": r.latency_us, "score": r.score,
            "workloads": {w.workload: w.latency_us for w in r.workloads if w.timed}, "bound": rows,
            "log": r.log_excerpt[:1500]}


def guard_costs() -> dict:
    """The integrity check of the runner's snapshot (forgery.arm, as the candidate's process arms it), without and
    with the audit hook, and the hook per event, in this process (the hook stays installed: run this last)."""
    import types

    from ksearch_graph.harness._torch import load_torch
    from ksearch_graph.harness.candidate import forgery, runner  # noqa: F401  (runner: its module is in the snapshot)
    from ksearch_graph.harness.guards import InterpreterHooks, LibraryPatches
    from ksearch_graph.harness.timer import Timer

    timer = Timer("cuda" if load_torch().cuda.is_available() else "cpu")
    timer.hooks = InterpreterHooks()
    patches = LibraryPatches()
    objects = {"the interpreter hooks": (timer.hooks, ()), "the library patches": (patches, ())}
    fns = [v for m in forgery.harness_modules().values() for v in vars(m).values()
           if isinstance(v, types.FunctionType)] * 20

    def per(fn, n: int) -> float:
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            fn()
            best = min(best, (time.perf_counter() - t0) / n * 1e6)
        return best

    plain_us = per(forgery.snapshot(forgery.harness_modules(), {"the timer": (timer, Timer.STATE), **objects}).changed,
                   1)
    read_us = per(lambda: [f.__code__ for f in fns], len(fns))
    guards = forgery.arm(tempfile.mkdtemp(), timer, objects)
    armed_us = guards.check_us(5)
    hooked_us = per(lambda: [f.__code__ for f in fns], len(fns))
    print(f"\nintegrity check per timed call: {plain_us:.0f} us, {armed_us:.0f} us under the audit hook; audit hook: "
          f"{hooked_us - read_us:.2f} us per event ({read_us:.3f} us for a __code__ read without it)")
    return {"integrity_check_us": plain_us, "integrity_check_armed_us": armed_us,
            "audit_hook_us_per_event": hooked_us - read_us}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=".")
    p.add_argument("--skip-tests", action="store_true")
    p.add_argument("--skip-trimul", action="store_true")
    args = p.parse_args()
    out = Path(args.out) / "forgery_check.json"
    out.parent.mkdir(parents=True, exist_ok=True)  # now: a missing folder must not lose the results at the end
    report: dict = {}
    if not args.skip_tests:
        report["tests_rc"] = run_tests()
    honest = (ROOT / "tests" / "cheats" / "honest.py").read_text()
    report["honest"] = [evaluate("cheat task, honest", ROOT / "tests" / "cheats" / "task", {"kernel.py": honest}),
                        evaluate("softmax seed", ROOT / "examples" / "softmax",
                                 {"kernel.py": (ROOT / "examples" / "softmax" / "seed.py").read_text()})]
    if not args.skip_trimul:
        from ksearch_graph.tasks.task import load_task

        trimul = load_task(ROOT / "examples" / "trimul")
        report["honest"].append(evaluate("trimul seed", ROOT / "examples" / "trimul",
                                         {"submission.py": trimul.seed_source}, workloads="all"))
    report["costs"] = guard_costs()
    out.write_text(json.dumps(report, indent=2))
    print(f"\nwrote {out}")
    return int(bool(report.get("tests_rc")) or any(h["status"] != "passed" for h in report["honest"]))


if __name__ == "__main__":
    sys.exit(main())
