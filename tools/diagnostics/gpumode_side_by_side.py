"""GPU MODE's own evaluator and ours, side by side, on the same submissions (GPU host).

    python tools/diagnostics/gpumode_side_by_side.py --reference-kernels PATH [--problem problems/bioml/trimul]
        [--upstream-runs 3] [--upstream-mode benchmark] [--time-budget-s 2] [--json OUT.json] SUBMISSION.py ...

For every submission:
- upstream: the problem's files staged as GPU MODE's runner stages them (task.yml ``files``, the submission as
  submission.py), ``python submission.py`` once (its compile step), then its eval.py in ``test`` mode on the tests
  and ``--upstream-runs`` times in ``--upstream-mode`` (benchmark: every benchmark, ranked by geometric mean) on the
  benchmarks, each reporting through the POPCORN_FD pipe as GPU MODE's runner reads it;
- ours: the problem materialised as ksearch does (upstream's argument parsing, float32 comparison, end_to_end timing)
  and the submission evaluated by the judge (ksearch_graph/harness/judge.py).

Prints per submission: pass/fail on both sides, per benchmark shape our latency, upstream's (mean of its runs, and
the spread of its runs), their ratio, and the geometric means. Nothing of GPU MODE's is kept: the staging folders
are temporary.
"""

from __future__ import annotations

import argparse
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
JUDGE = ROOT / "ksearch_graph" / "harness" / "judge.py"


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


def run_upstream(folder: Path, main: str, mode: str, cases: str, timeout_s: float) -> tuple[dict, str]:
    """eval.py MODE CASES in ``folder``: (its POPCORN report, its stderr tail)."""
    read, write = os.pipe()
    env = {**os.environ, "POPCORN_FD": str(write)}
    env.pop("POPCORN_SEED", None)
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, main, mode, cases], cwd=folder, env=env, pass_fds=[write],
                                stdout=subprocess.DEVNULL, stderr=err)
        os.close(write)
        report, deadline = b"", time.monotonic() + timeout_s
        with os.fdopen(read, "rb") as pipe:  # until eval.py closes it, or the time is up
            while time.monotonic() < deadline and select.select([pipe], [], [], deadline - time.monotonic())[0]:
                chunk = os.read(pipe.fileno(), 1 << 16)
                if not chunk:
                    break
                report += chunk
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
        report = report.decode(errors="replace")
        err.seek(0)
        tail = err.read().decode(errors="replace")[-800:]
    return parse_popcorn(report), tail


def upstream_side(problem: Path, submission: Path, runs: int, mode: str, timeout_s: float) -> dict:
    """{"tests": pass/fail, "runs": [{benchmark index: mean us} or an error string], "error": ...}"""
    with tempfile.TemporaryDirectory(prefix="gpumode-upstream-") as tmp:
        folder = Path(tmp)
        raw = stage_upstream(problem, submission, folder)
        main = (raw.get("config") or {}).get("main", "eval.py")
        subprocess.run([sys.executable, "submission.py"], cwd=folder, capture_output=True, timeout=timeout_s)
        report, tail = run_upstream(folder, main, "test", "tests.txt", timeout_s)
        result = {"tests": report.get("check", "no report"), "runs": [], "test_errors": {
            k: v for k, v in report.items() if k.endswith(".error")}, "stderr": tail if not report else ""}
        for _ in range(runs):
            report, tail = run_upstream(folder, main, mode, "benchmarks.txt", timeout_s)
            count = int(report.get("benchmark-count", 0) or 0)
            if report.get("check") != "pass":
                errors = {k: v for k, v in report.items() if k.endswith(".error")}
                result["runs"].append(json.dumps(errors)[:500] or tail)
                continue
            result["runs"].append({i: float(report[f"benchmark.{i}.mean"]) / 1e3 for i in range(count)})
    return result


def ours_side(task_dir: Path, submission: Path, budget_s: float, timeout_s: float) -> dict:
    """Our judge's result for the submission: status, per benchmark index its latency (us)."""
    with tempfile.TemporaryDirectory(prefix="gpumode-ours-") as tmp:
        candidate = Path(tmp) / "candidate"
        candidate.mkdir()
        shutil.copyfile(submission, candidate / "submission.py")
        out = Path(tmp) / "result.json"
        subprocess.run([sys.executable, str(JUDGE), "--task", str(task_dir), "--candidate", str(candidate),
                        "--out", str(out), "--time-budget-s", str(budget_s)], timeout=timeout_s)
        result = json.loads(out.read_text())
    latencies = {}
    for w in result.get("workloads", []):
        if w.get("timed") and w.get("latency_us"):
            latencies[int(w["workload"].split("-")[1])] = w["latency_us"]
    return {"status": result["status"], "latencies": latencies, "flags": result.get("flags", []),
            "log": result.get("log_excerpt", "")[:300]}


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
    p.add_argument("--upstream-runs", type=int, default=3)
    p.add_argument("--upstream-mode", default="benchmark", choices=["benchmark", "leaderboard"])
    p.add_argument("--time-budget-s", type=float, default=2.0, help="our judge's timing budget per workload")
    p.add_argument("--timeout-s", type=float, default=1800)
    p.add_argument("--json", type=Path, help="also write every figure here")
    args = p.parse_args(argv)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
    problem = (args.reference_kernels / args.problem).resolve()
    missing = [s for s in args.submissions if not s.is_file()]
    if not (problem / "task.yml").is_file() or missing:
        p.error(f"no task.yml in {problem}" if not missing else f"no such submission: {missing[0]}")
    sys.path.insert(0, str(ROOT))
    from ksearch_graph.gpumode import materialise_gpumode

    report = {}
    with tempfile.TemporaryDirectory(prefix="gpumode-task-") as tmp:
        task_dir = materialise_gpumode(problem, Path(tmp) / "task")
        for submission in args.submissions:  # each one's figures printed and written as soon as they are in
            print(f"[side-by-side] {submission}: ours", file=sys.stderr, flush=True)
            ours = ours_side(task_dir, submission, args.time_budget_s, args.timeout_s)
            print(f"[side-by-side] {submission}: upstream", file=sys.stderr, flush=True)
            upstream = upstream_side(problem, submission, args.upstream_runs, args.upstream_mode, args.timeout_s)
            report[str(submission)] = {"ours": ours, "upstream": upstream}
            print("\n".join(table(str(submission), ours, upstream) + [""]), flush=True)
            if args.json:
                args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
