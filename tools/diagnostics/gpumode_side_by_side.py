"""GPU MODE's own evaluator and ours, side by side, on the same submissions (GPU host), within one time budget.

    python tools/diagnostics/gpumode_side_by_side.py --reference-kernels PATH [--problem problems/bioml/trimul]
        [--upstream-runs 1] [--upstream-mode benchmark] [--time-budget-s 1] [--deadline-s 570]
        [--parallel-tests 3] [--json OUT.json] SUBMISSION.py ...

For every submission:
- upstream: the problem's files staged as GPU MODE's runner stages them (task.yml ``files``, the submission as
  submission.py), ``python submission.py`` once (its compile step), its eval.py in ``test`` mode on the tests, and
  ``--upstream-runs`` times in ``--upstream-mode`` (benchmark: every benchmark, ranked by geometric mean) on the
  benchmarks, each reporting through the POPCORN_FD pipe as GPU MODE's runner reads it;
- ours: the problem materialised as ksearch does and the submission evaluated by the judge
  (ksearch_graph/harness/judge/judge.py).

Time: the untimed upstream steps (compile, test mode: TriMul's tests draw 1.4 G Cauchy values on the CPU) run first,
``--parallel-tests`` submissions at a time; then, one submission at a time, ours and upstream's benchmark runs (the
timed ones, alone on the GPU). Each step has its own limit (``--compile-timeout-s``, ``--test-timeout-s``,
``--ours-timeout-s``, ``--bench-timeout-s``), and no timed step starts that could end after ``--deadline-s`` (from
the start): what did not run is reported as such, so the whole fits one 10-minute call. Progress lines go to stderr
as each step ends; a submission's table is printed (and the JSON written) as soon as its figures are in. Nothing of
GPU MODE's is kept: the staging folders are temporary.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
JUDGE = ROOT / "ksearch_graph" / "harness" / "judge" / "judge.py"
STARTED = time.monotonic()


def say(message: str) -> None:
    print(f"[side-by-side {time.monotonic() - STARTED:5.0f}s] {message}", file=sys.stderr, flush=True)


def build_test_string(specs: list[dict]) -> str:
    """The test file GPU MODE's runner writes for eval.py: one ``key: value; key: value`` line per spec."""
    return "".join("; ".join(f"{k}: {v}" for k, v in spec.items()) + "\n" for spec in specs)


def parse_popcorn(text: str) -> dict[str, str]:
    """eval.py's report through POPCORN_FD: ``key: value`` lines."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(": ")
        if sep:
            out[key.strip()] = value.strip()
    return out


def load_yaml(problem: Path) -> dict:
    import yaml

    return yaml.safe_load((problem / "task.yml").read_text())


def stage_upstream(problem: Path, submission: Path, into: Path) -> dict:
    """The problem's files and the submission in ``into``, as GPU MODE's runner lays them out; task.yml's dict."""
    raw = load_yaml(problem)
    for entry in raw.get("files") or []:
        source = submission if entry["source"] == "@SUBMISSION@" else problem / entry["source"]
        shutil.copyfile(source, into / entry["name"])
    (into / "tests.txt").write_text(build_test_string(raw.get("tests") or []))
    benchmarks = raw.get("benchmarks") or []
    ranked = benchmarks if raw.get("ranking_by", "last") != "last" else benchmarks[-1:]
    (into / "benchmarks.txt").write_text(build_test_string(ranked))
    return raw


def run_upstream(folder: Path, main: str, mode: str, cases: str, timeout_s: float,
                 label: str = "") -> tuple[dict, str]:
    """eval.py MODE CASES in ``folder``: (its POPCORN report, its stderr tail); a progress line for every test or
    benchmark it reports, as it comes. Stopped after ``timeout_s``: its check is then "no verdict"."""
    read, write = os.pipe()
    env = {**os.environ, "POPCORN_FD": str(write)}
    env.pop("POPCORN_SEED", None)
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, main, mode, cases], cwd=folder, env=env, pass_fds=[write],
                                stdout=subprocess.DEVNULL, stderr=err)
        os.close(write)
        report, deadline, shown = b"", time.monotonic() + timeout_s, 0
        with os.fdopen(read, "rb") as pipe:  # until eval.py closes it, or the time is up
            while time.monotonic() < deadline and select.select([pipe], [], [], deadline - time.monotonic())[0]:
                chunk = os.read(pipe.fileno(), 1 << 16)
                if not chunk:
                    break
                report += chunk
                done = [ln for ln in report.decode(errors="replace").splitlines()
                        if ln.split(":")[0].endswith((".status", ".mean"))]
                for line in done[shown:]:
                    say(f"{label} upstream {mode}: {line[:100]}")
                shown = len(done)
        stopped = False
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            stopped = True
        report = report.decode(errors="replace")
        err.seek(0)
        tail = err.read().decode(errors="replace")[-800:]
    parsed = parse_popcorn(report)
    if stopped or (time.monotonic() >= deadline and "check" not in parsed):
        parsed["check"] = f"no verdict: stopped after {timeout_s:.0f} s"
    return parsed, tail


def upstream_compile_and_test(problem: Path, submission: Path, folder: Path, compile_s: float,
                              test_s: float) -> dict:
    """The untimed upstream steps in ``folder``: staging, ``python submission.py``, eval.py in test mode."""
    raw = stage_upstream(problem, submission, folder)
    main = (raw.get("config") or {}).get("main", "eval.py")
    t0 = time.monotonic()
    try:
        subprocess.run([sys.executable, "submission.py"], cwd=folder, capture_output=True, timeout=compile_s)
    except subprocess.TimeoutExpired:
        return {"tests": f"no verdict: its compile step ran past {compile_s:.0f} s", "test_errors": {},
                "stderr": "", "test_s": time.monotonic() - t0}
    report, tail = run_upstream(folder, main, "test", "tests.txt", test_s, submission.stem)
    return {"tests": report.get("check", "no report"),
            "test_errors": {k: v for k, v in report.items() if k.endswith(".error")},
            "stderr": tail if not report else "", "test_s": time.monotonic() - t0}


def upstream_benchmarks(folder: Path, main: str, runs: int, mode: str, timeout_s: float, label: str,
                        deadline: float) -> list:
    """``runs`` benchmark runs of eval.py: per run {benchmark index: mean us}, or what went wrong."""
    out: list = []
    for _ in range(runs):
        if time.monotonic() + timeout_s > deadline:
            out.append(f"not run: another {timeout_s:.0f} s would pass the deadline")
            break
        report, tail = run_upstream(folder, main, mode, "benchmarks.txt", timeout_s, label)
        count = int(report.get("benchmark-count", 0) or 0)
        if report.get("check") != "pass":
            errors = {k: v for k, v in report.items() if k.endswith(".error")}
            out.append((json.dumps(errors)[:500] if errors else report.get("check", "")) or tail)
            continue
        out.append({i: float(report[f"benchmark.{i}.mean"]) / 1e3 for i in range(count)})
    return out


def ours_side(task_dir: Path, submission: Path, budget_s: float, timeout_s: float) -> dict:
    """Our judge's result for the submission: status, per benchmark index its latency (us), its wall time."""
    with tempfile.TemporaryDirectory(prefix="gpumode-ours-") as tmp:
        candidate = Path(tmp) / "candidate"
        candidate.mkdir()
        shutil.copyfile(submission, candidate / "submission.py")
        out = Path(tmp) / "result.json"
        t0 = time.monotonic()
        try:
            subprocess.run([sys.executable, str(JUDGE), "--task", str(task_dir), "--candidate", str(candidate),
                            "--out", str(out), "--time-budget-s", str(budget_s)], timeout=timeout_s,
                           stdout=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return {"status": f"no verdict: stopped after {timeout_s:.0f} s", "latencies": {}, "flags": [],
                    "log": "", "wall_s": time.monotonic() - t0}
        result = json.loads(out.read_text()) if out.is_file() else {"status": "no result file"}
    latencies = {}
    for w in result.get("workloads", []):
        if w.get("timed") and w.get("latency_us"):
            latencies[int(w["workload"].split("-")[1])] = w["latency_us"]
    return {"status": result["status"], "latencies": latencies, "flags": result.get("flags", []),
            "log": result.get("log_excerpt", "")[:300], "wall_s": result.get("wall_s"),
            "phases": result.get("phases", {})}


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values and min(values) > 0 else float("nan")


def table(name: str, ours: dict, upstream: dict) -> list[str]:
    runs = [r for r in upstream["runs"] if isinstance(r, dict)]
    lines = [f"## {name}",
             f"upstream tests: {upstream['tests']}; upstream benchmark runs passed: {len(runs)}/{len(upstream['runs'])}"
             f"; ours: {ours['status']}" + (f" (flags: {', '.join(ours['flags'])})" if ours["flags"] else "")]
    if ours["status"] != "passed":
        lines.append(f"ours: {ours['log']}")
    lines += [f"upstream failure: {r}" for r in upstream["runs"] if not isinstance(r, dict)][:1]
    lines += [f"upstream test failure: {k}: {v[:200]}" for k, v in upstream.get("test_errors", {}).items()][:2]
    if not runs or not ours["latencies"]:
        return lines
    lines.append(f"{'benchmark':>9} {'ours us':>10} {'upstream us':>12} {'runs min-max':>20} {'ours/up':>8}")
    ratios, ours_all, up_all = [], [], []
    for i in sorted(ours["latencies"]):
        per_run = [r[i] for r in runs if i in r]
        if not per_run:
            continue
        up = sum(per_run) / len(per_run)
        ratio = ours["latencies"][i] / up
        ratios.append(ratio)
        ours_all.append(ours["latencies"][i])
        up_all.append(up)
        lines.append(f"{i:>9} {ours['latencies'][i]:>10.1f} {up:>12.1f} "
                     f"{min(per_run):>9.1f}-{max(per_run):<10.1f} {ratio:>8.3f}")
    run_geos = [geomean([r[i] for i in sorted(r)]) for r in runs]
    lines.append(f"{'geomean':>9} {geomean(ours_all):>10.1f} {geomean(up_all):>12.1f} "
                 f"{min(run_geos):>9.1f}-{max(run_geos):<10.1f} {geomean(ratios):>8.3f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("submissions", nargs="+", type=Path)
    p.add_argument("--reference-kernels", type=Path, required=True, help="a checkout of gpu-mode/reference-kernels")
    p.add_argument("--problem", default="problems/bioml/trimul", help="the problem folder inside it")
    p.add_argument("--upstream-runs", type=int, default=1)
    p.add_argument("--upstream-mode", default="benchmark", choices=["benchmark", "leaderboard"])
    p.add_argument("--time-budget-s", type=float, default=1.0, help="our judge's timing budget per workload")
    p.add_argument("--deadline-s", type=float, default=570, help="start no timed step that could end after this")
    p.add_argument("--parallel-tests", type=int, default=3,
                   help="submissions whose untimed upstream steps (compile, test mode) run at once")
    p.add_argument("--compile-timeout-s", type=float, default=240, help="upstream's `python submission.py`")
    p.add_argument("--test-timeout-s", type=float, default=240, help="upstream's test mode")
    p.add_argument("--ours-timeout-s", type=float, default=90, help="our judge, per submission")
    p.add_argument("--bench-timeout-s", type=float, default=75, help="each upstream benchmark run")
    p.add_argument("--json", type=Path, help="also write every figure here")
    args = p.parse_args(argv)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
    problem = (args.reference_kernels / args.problem).resolve()
    missing = [s for s in args.submissions if not s.is_file()]
    if not (problem / "task.yml").is_file() or missing:
        p.error(f"no task.yml in {problem}" if not missing else f"no such submission: {missing[0]}")
    sys.path.insert(0, str(ROOT))
    from ksearch_graph.tasks.gpumode import materialise_gpumode

    deadline = STARTED + args.deadline_s
    report: dict = {}

    def record(submission: Path, part: str, value) -> None:
        report.setdefault(str(submission), {})[part] = value
        if args.json:
            args.json.write_text(json.dumps(report, indent=1))

    with tempfile.TemporaryDirectory(prefix="gpumode-side-by-side-") as tmp:
        task_dir = materialise_gpumode(problem, Path(tmp) / "task")
        folders = {s: Path(tmp) / f"upstream-{i}" for i, s in enumerate(args.submissions)}
        for folder in folders.values():
            folder.mkdir()
        say(f"{problem.name}: upstream's untimed steps, {args.parallel_tests} submissions at a time")
        with concurrent.futures.ThreadPoolExecutor(max(1, args.parallel_tests)) as pool:
            futures = {pool.submit(upstream_compile_and_test, problem, s, folders[s], args.compile_timeout_s,
                                   args.test_timeout_s): s for s in args.submissions}
            for future in concurrent.futures.as_completed(futures):
                s = futures[future]
                got = future.result()
                record(s, "upstream", got | {"runs": []})
                say(f"{s.stem}: upstream tests {got['tests']} ({got['test_s']:.0f} s)")
        main_file = (load_yaml(problem).get("config") or {}).get("main", "eval.py")
        for s in args.submissions:  # the timed steps: one submission at a time, alone on the GPU
            upstream = report[str(s)]["upstream"]
            if time.monotonic() + args.ours_timeout_s > deadline:
                ours = {"status": "not run: another evaluation would pass the deadline", "latencies": {},
                        "flags": [], "log": ""}
            else:
                say(f"{s.stem}: ours")
                ours = ours_side(task_dir, s, args.time_budget_s, args.ours_timeout_s)
            record(s, "ours", ours)
            say(f"{s.stem}: ours {ours['status']}" + (f" in {ours['wall_s']:.1f} s" if ours.get("wall_s") else ""))
            upstream["runs"] = upstream_benchmarks(folders[s], main_file, args.upstream_runs, args.upstream_mode,
                                                   args.bench_timeout_s, s.stem, deadline)
            record(s, "upstream", upstream)
            print("\n".join(table(str(s), ours, upstream) + [""]), flush=True)
    say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
