"""The harness's GPU self-test, in one call on a GPU host: the test suite with its GPU tests, then a calibration table.

    python tools/gpu_selftest.py [--out DIR] [--skip-tests] [--skip-calibration] [--skip-trimul] [--tests FILE ...]
                                 [--skip-sandbox-cost] [--skip-handover] [--skip-bound] [--evaluations N]
                                 [--budget-s S]

1. pytest over the harness's test files with the ``gpu`` marker included (on a CPU machine they skip themselves).
2. Calibration (tools/calibration/): each workload evaluated by the harness three times (``--evaluations``; each
   workload's timing budget ``--budget-s``, the harness's default 1 s: a larger one shows whether more bursts
   narrow a power-limited kernel's spread), in fresh processes (the
   reference, the same vendor call, timed in each: the spread of the speedups is that of a search's ranking; each
   burst of timed calls listed from the timing trace), and timed independently with none of the harness's code:
   ``triton.testing.do_bench`` (cold L2: it zeroes a 256 MB buffer before every call; 300 ms of uninterrupted
   calls), calls on 8 input sets in turn with a flush before and a synchronize after each (the harness's pattern
   without its checks and copies), and CUDA-graph replay of 20 calls (warm L2), each INDEPENDENT_ROUNDS times, a
   round over all workloads. Prints a table: harness mean, its spread over the evaluations, each independent
   figure (median of its rounds) with its own spread and the difference. The spreads matter for power-limited
   kernels: do_bench read a 4096^3 bf16 matmul at 176.6 and 192.3 us in two calls, so one reading of
   it cannot judge a 5% agreement.
4. The sandbox's cost: the TriMul seed with and without it (``sandbox_cost``).
5. The hand-overs of a timed call between two polling processes (tools/diagnostics/diagnose_handover.py) and the
   judge's bound on forged timings at 1 and 10 ms calls (tools/bound_table.py); ``--skip-handover``,
   ``--skip-bound``.
3. TriMul (examples/trimul/, all 25 workloads: 18 correctness-only + 7 timed) with the seed submission, three times
   with one evaluator, as a search would: each finds its processes prestarted (imports done: the first pair starts
   when the search does, ``start_ahead(task)``, and times the reference while it waits; that wait, the cold imports
   and the reference timing, is reported), the next two reuse its timings. Each with the evaluation's phase
   breakdown (``timing_heat`` and ``timing_fill`` are parts of ``timing``).
Writes selftest.json and selftest.md into --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HARNESS_TESTS = ["tests/test_evaluation.py", "tests/test_judge.py", "tests/test_timing.py", "tests/test_gpu.py",
                 "tests/test_guards.py", "tests/test_tensors.py", "tests/test_wire.py", "tests/test_cheats.py",
                 "tests/test_forgery.py", "tests/test_time_bound.py", "tests/test_trimul.py", "tests/test_compare.py",
                 "tests/test_sandbox.py", "tests/test_zero_trust.py"]


def run_tests(files: list[str]) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *files]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    tail = (proc.stdout + proc.stderr)[-6000:]
    print(tail, flush=True)
    return {"command": " ".join(cmd[1:]), "returncode": proc.returncode, "seconds": time.perf_counter() - t0,
            "summary": tail.strip().splitlines()[-1] if tail.strip() else ""}


def independent_times(workload) -> dict:
    import torch
    import triton.testing

    sys.path.insert(0, str(ROOT / "tools" / "calibration"))
    import kernel
    import reference

    inputs = reference.make_inputs(workload.params, 1234, "cuda")
    fn = lambda: kernel.op(*inputs)  # noqa: E731
    fn()
    torch.cuda.synchronize()
    do_bench_ms = triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="mean")
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timed(args) -> float:
        flush.zero_()
        start.record()
        kernel.op(*args)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e3

    # Back to back on 8 input sets in turn, a synchronize after each call (the harness's pattern), after 50 ms of the
    # same.
    pool = [reference.make_inputs(workload.params, 2000 + i, "cuda") for i in range(8)]
    until = time.perf_counter() + 0.05
    while time.perf_counter() < until:
        timed(pool[0])
    rotated = [timed(pool[i % 8]) for i in range(40)]
    del pool
    # CUDA graph replay: 20 calls captured back to back (warm L2 between them: a lower bound for small kernels).
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(20):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    reps = []
    for _ in range(5):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        reps.append(start.elapsed_time(end) * 1e3 / 20)
    del graph
    return {"do_bench_us": do_bench_ms * 1e3, "rotated_us": statistics.fmean(rotated),
            "graph_us": statistics.median(reps)}


COMPARED = ("do_bench_us", "rotated_us")  # the independent figures the harness's is compared with
INDEPENDENT = (*COMPARED, "graph_us")
INDEPENDENT_ROUNDS = 3


def calibrate(rows: list, evaluations: int = 3, budget_s: float = 1.0) -> None:
    from ksearch_graph.tasks.task import load_task

    sys.path.insert(0, str(ROOT / "tools" / "diagnostics"))
    from trace_evaluations import traced_evaluations

    task = load_task(ROOT / "tools" / "calibration")
    source = (ROOT / "tools" / "calibration" / "kernel.py").read_text()
    # The reference (the same vendor call) is timed in every evaluation: a search ranks candidates by speedups, and
    # their spread over evaluations says how much of the absolute times' spread the GPU's state shares between a
    # candidate and its reference. Every timed call is traced by the judge: each burst's mean shows whether a
    # workload's bursts agree (a later burst follows the judge's checks of the one before, the GPU idle meanwhile).
    # The evaluator is closed before the independent timings below and the TriMul evaluations are not traced.
    runs, bursts = [], []
    for i, (r, lines) in enumerate(traced_evaluations(task, {"kernel.py": source}, evaluations, budget_s,
                                                      "calibration", timeout_s=600)):
        print(f"calibration evaluation {i + 1}: {r.status.value}, wall {r.wall_s:.1f} s {r.log_excerpt[:300]}",
              flush=True)
        runs.append(r)
        bursts.append(lines)
    # Rounds over all workloads, as the evaluations are: each workload's figures follow other workloads' load.
    independent = {w.name: [] for w in task.spec.workloads}
    if any(r.passed for r in runs):
        for _ in range(INDEPENDENT_ROUNDS):
            for w in task.spec.workloads:
                independent[w.name].append(independent_times(w))
    for w in task.spec.workloads:
        found = [next(x for x in r.workloads if x.workload == w.name) for r in runs if r.passed]
        row = {"workload": w.name, "harness_us": [round(x.latency_us, 2) for x in found], "runs": [x.runs for x in found],
               "power_limited": [x.power_limited for x in found],
               "harness_median_us": [round(x.median_us, 2) for x in found],
               "harness_std_us": [round(x.std_us, 2) for x in found],
               "speedups": [round(x.speedup, 4) for x in found if x.speedup],
               # per passed evaluation, per side: [(first call's index, calls, mean device us)] of each burst
               # (a burst the side-stream rule dropped and timed again ends with "dropped")
               "bursts": [{who: [(b["first"], len(b["calls"]), round(statistics.fmean(c[0] for c in b["calls"]), 2))
                                 + (("dropped",) if b.get("dropped") else ())
                                 for b in done if b["who"] == who and b["workload"] == w.name]
                           for who in ("candidate", "reference")}
                          for r, done in zip(runs, bursts) if r.passed]}
        if found:
            for name in INDEPENDENT:
                seen = [round(t[name], 2) for t in independent[w.name]]
                row[f"{name}_rounds"], row[name] = seen, statistics.median(seen)
                row[f"{name}_spread_pct"] = 100 * (max(seen) - min(seen)) / row[name]
            mid = statistics.median(x.latency_us for x in found)
            row["harness_mean_us"] = mid
            row["repeat_spread_pct"] = 100 * (max(row["harness_us"]) - min(row["harness_us"])) / mid
            medians = row["harness_median_us"]  # the spread of the medians, for comparison (scores use means)
            row["median_spread_pct"] = 100 * (max(medians) - min(medians)) / statistics.median(medians)
            if row["speedups"]:
                row["speedup_spread_pct"] = 100 * (max(row["speedups"]) - min(row["speedups"])) / statistics.median(
                    row["speedups"])
            for name in COMPARED:
                row[f"vs_{name}_pct"] = 100 * (mid - row[name]) / row[name]
        rows.append(row)
        print(row, flush=True)


def trimul(report: dict) -> None:
    from ksearch_graph.harness.parent.client import SubprocessEvaluator
    from ksearch_graph.tasks.task import load_task

    task = load_task(ROOT / "examples" / "trimul")
    evaluator = SubprocessEvaluator(timeout_s=600, workloads="all", time_budget_s=1.0)
    evaluator.start_ahead(task)  # as a search does when it starts
    report["trimul"] = []
    for i in range(3):
        # As in a search, where the LLM's turn gives the prestarted processes time to import torch (the first pair
        # starts with the search); the first wait is that import, on a fresh host.
        t0 = time.perf_counter()
        evaluator.wait_until_prestarted()
        waited_s = time.perf_counter() - t0
        r = evaluator.evaluate(task, {"submission.py": task.seed_source}, attempt_id=f"trimul-{i}")
        entry = {"status": r.status.value, "wall_s": r.wall_s, "waited_for_prestart_s": waited_s,
                 "phases": r.phases, "score": r.score,
                 "reference_timing": r.environment.get("reference_timing"),
                 "prestarted": bool(r.environment.get("prestarted")),
                 "latency_us": r.latency_us, "compile_s": r.compile_s, "log": r.log_excerpt[:500],
                 "workloads": [w.model_dump() for w in r.workloads],
                 "power_limited": [w.workload for w in r.workloads if w.power_limited]}
        report["trimul"].append(entry)
        print(f"trimul evaluation {i + 1}: {r.status.value}, wall {r.wall_s:.2f} s (after {waited_s:.2f} s waiting "
              f"for its prestarted processes), phases {r.phases}, power-limited {entry['power_limited']}, "
              f"score {r.score:.4f}, geomean {r.latency_us}, reference {entry['reference_timing']}, "
              f"prestarted {entry['prestarted']}", flush=True)
    evaluator.close()


def sandbox_cost(report: dict, rounds: int = 2) -> None:
    """The sandbox's cost on the TriMul seed: evaluations with and without it, alternating, one evaluator each (so
    each reuses its reference timings); per workload the mean latency with the sandbox against without, and each
    evaluation's wall time and start-up."""
    from ksearch_graph.harness.parent.client import SubprocessEvaluator
    from ksearch_graph.tasks.task import load_task

    task = load_task(ROOT / "examples" / "trimul")
    evaluators = {kind: SubprocessEvaluator(timeout_s=600, workloads="all", time_budget_s=1.0, sandbox=kind,
                                            prestart=False) for kind in ("bwrap", "none")}
    runs = {kind: [] for kind in evaluators}
    for i in range(rounds):
        for kind, evaluator in evaluators.items():
            r = evaluator.evaluate(task, {"submission.py": task.seed_source}, attempt_id=f"sandbox-{kind}-{i}")
            runs[kind].append(r)
            print(f"sandbox {kind} {i + 1}: {r.status.value}, wall {r.wall_s:.2f} s, phases {r.phases}", flush=True)
    rows = []
    for w in task.spec.workloads:
        if not w.timed:
            continue
        means = {kind: [x.latency_us for r in rs if r.passed for x in r.workloads if x.workload == w.name]
                 for kind, rs in runs.items()}
        if all(means.values()):
            a, b = statistics.fmean(means["bwrap"]), statistics.fmean(means["none"])
            rows.append({"workload": w.name, "bwrap_us": a, "none_us": b, "diff_pct": 100 * (a - b) / b})
    report["sandbox_cost"] = {"rows": rows, "wall_s": {k: [r.wall_s for r in rs] for k, rs in runs.items()},
                              "startup_s": {k: [r.phases.get("startup", 0.0) + r.phases.get("spawn", 0.0)
                                                for r in rs] for k, rs in runs.items()},
                              "status": {k: [r.status.value for r in rs] for k, rs in runs.items()}}
    for e in evaluators.values():
        e.close()


def subprocess_stage(report: dict, key: str, argv: list[str], out: Path, timeout_s: float) -> None:
    """One of the repository's own GPU tools in a process of its own (it forks, or starts evaluators): its JSON
    rows under ``report[key]``, its output's tail printed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
        tail, code = (proc.stdout + proc.stderr)[-3000:], proc.returncode
    except subprocess.TimeoutExpired:
        tail, code = f"timed out after {timeout_s:g} s", None
    print(tail, flush=True)
    rows = json.loads(out.read_text()) if out.exists() else None
    report[key] = {"command": " ".join(argv), "returncode": code, "seconds": time.perf_counter() - t0, "rows": rows}


def markdown(report: dict) -> str:
    lines = [f"GPU self-test, {report['date']}, {report['environment']}", ""]
    if report.get("tests"):
        t = report["tests"]
        lines += [f"Tests: `{t['command']}` -> {t['summary']} ({t['seconds']:.0f} s)", ""]
    labels = {"do_bench_us": "do_bench (cold L2)", "rotated_us": "back to back, 8 input sets"}
    head = " | ".join(f"{labels[n]} | its spread | diff" for n in COMPARED)
    lines += [f"Independent figures: the median of {INDEPENDENT_ROUNDS} rounds, with their spread.", "",
              f"| workload | harness ({report.get('evaluations', 3)} evaluations, {report.get('budget_s', 1.0):g} s "
              "budget) | spread | speedup vs the reference (same call) | its spread | "
              f"{head} | graph replay |",
              "| --- | --- | --- | --- | --- | " + "--- | --- | --- | " * len(COMPARED) + "--- |"]
    for row in report["calibration"]:
        if "harness_mean_us" not in row:
            lines.append(f"| {row['workload']} | failed |")
            continue
        cells = " | ".join(f"{row[n]:.1f} us | {row[f'{n}_spread_pct']:.2f}% | {row[f'vs_{n}_pct']:+.2f}%"
                           for n in COMPARED)
        speedups = row["speedups"]
        speedup = (f"{min(speedups):.3f}-{max(speedups):.3f} | {row['speedup_spread_pct']:.2f}%" if speedups
                   else "- | -")
        lines.append(f"| {row['workload']} | {row['harness_mean_us']:.1f} us | {row['repeat_spread_pct']:.2f}% | "
                     f"{speedup} | {cells} | {row['graph_us']:.1f} us |")
    if report["calibration"]:
        lines += ["", "Each burst of timed calls (candidate; reference): calls, mean; evaluations apart by |."]
    for row in report["calibration"]:
        cells = [" ".join(f"{n}: {us:.1f}{' (dropped)' if dropped else ''}" for _, n, us, *dropped in e["candidate"])
                 + "; " + " ".join(f"{n}: {us:.1f}" for _, n, us in e["reference"]) for e in row.get("bursts", [])]
        lines.append(f"- {row['workload']}: " + " | ".join(cells))
    for i, t in enumerate(report.get("trimul", [])):
        lines.append("")
        lines.append(f"TriMul evaluation {i + 1}: {t['status']}, wall {t['wall_s']:.2f} s (after waiting "
                     f"{t['waited_for_prestart_s']:.2f} s for its prestarted processes), reference timing "
                     f"{t['reference_timing']}, prestarted {t['prestarted']}, power-limited workloads "
                     f"{t.get('power_limited')}, phases {t['phases']}")
    hand = report.get("handover")
    if hand and hand.get("rows"):
        lines += ["", f"Hand-overs of a timed call between two polling processes (`{hand['command']}`):", "",
                  "| case | round trip (us) | hand-over median | p90 | max | over 1 ms |", "| --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {r['case']} | {r['round_trip_median_us']:.0f} | {r['handover_median_us']:.0f} | "
                  f"{r['handover_p90_us']:.0f} | {r['handover_max_us']:.0f} | {r['over_1ms']} of {r['calls']} |"
                  for r in hand["rows"]]
    bound = report.get("bound")
    if bound and bound.get("rows"):
        lines += ["", f"The judge's bound (`{bound['command']}`): per call length, the largest under-reporting "
                  "factor that passed and the largest gain it bought: " + ", ".join(
                      f"{r['length_us']:g} us: {r['largest_passing'] or 'none'} (gain {r.get('largest_gain') or '-'})"
                      for r in bound["rows"]["rows"])]
    cost = report.get("sandbox_cost")
    if cost:
        lines += ["", f"Sandbox cost on the TriMul seed: statuses {cost['status']}, wall s {cost['wall_s']}, "
                  f"start-up s {cost['startup_s']}", "", "| workload | with bwrap | without | diff |",
                  "| --- | --- | --- | --- |"]
        lines += [f"| {r['workload']} | {r['bwrap_us']:.1f} us | {r['none_us']:.1f} us | {r['diff_pct']:+.2f}% |"
                  for r in cost["rows"]]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=".")
    p.add_argument("--skip-tests", action="store_true")
    p.add_argument("--skip-trimul", action="store_true")
    p.add_argument("--skip-calibration", action="store_true")
    p.add_argument("--skip-sandbox-cost", action="store_true")
    p.add_argument("--skip-handover", action="store_true", help="skip tools/diagnostics/diagnose_handover.py")
    p.add_argument("--skip-bound", action="store_true", help="skip tools/bound_table.py (1 and 10 ms calls)")
    p.add_argument("--tests", nargs="*", default=HARNESS_TESTS)
    p.add_argument("--evaluations", type=int, default=3, help="calibration evaluations (at least 2)")
    p.add_argument("--budget-s", type=float, default=1.0, help="calibration: each workload's timing budget")
    args = p.parse_args()
    if args.evaluations < 2 or not args.budget_s > 0:
        p.error("--evaluations needs at least 2 (a spread) and --budget-s a positive number")
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU here: the self-test needs one")
        return 2
    report = {"date": time.strftime("%Y-%m-%d"), "calibration": [], "evaluations": args.evaluations,
              "budget_s": args.budget_s,
              "environment": f"{torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}"}
    if not args.skip_tests:
        report["tests"] = run_tests(args.tests)
    if not args.skip_calibration:
        calibrate(report["calibration"], args.evaluations, args.budget_s)
    if not args.skip_trimul:
        trimul(report)
    if not args.skip_sandbox_cost:
        sandbox_cost(report)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.skip_handover:
        subprocess_stage(report, "handover", ["tools/diagnostics/diagnose_handover.py", "--calls", "100", "--json",
                                              str(out / "handover.json")], out / "handover.json", 120)
    if not args.skip_bound:
        subprocess_stage(report, "bound", ["tools/bound_table.py", "--lengths-us", "1000,10000", "--factors",
                                           "1.5,2,3", "--out", str(out / "bound")], out / "bound" / "bound_table.json",
                         240)
    (out / "selftest.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "selftest.md").write_text(markdown(report))
    print(markdown(report))
    return 0 if report.get("tests", {}).get("returncode", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
