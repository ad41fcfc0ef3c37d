"""Which public kernel problems are tasks here: for any mix of folders and files (GPU MODE problem folders or a
reference-kernels checkout, KernelBench problem files or levels, FlashInfer-Trace datasets or definitions, our task
folders), each problem materialised, its requirements checked against this machine, its inputs sized on the meta
device, and with ``--evaluate`` the problem's own reference evaluated as a candidate by the harness.

    python tools/task_coverage.py FOLDER_OR_FILE... [--evaluate] [--sample N] [--jobs J] [--timeout-s S]
        [--max-input-mb MB] [--json OUT.json] [--markdown OUT.md]

Every problem ends in one of: ``refused`` (not a task, with the reason), ``unavailable`` (a task this machine cannot
run: no GPU, no ROCm, an older GPU, a missing module; with the reason), ``too large`` (one input set over
``--max-input-mb``), ``not evaluated`` (``--evaluate`` not given, or not in the ``--sample``), or the status of its
reference as the candidate (``passed``, or the failure and its message). Prints a table per source (the folder given
on the command line) and the reasons; ``--json`` keeps every problem's row.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import random
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ksearch_graph.tasks.task import TaskError, load_task  # noqa: E402
from ksearch_graph.tasks.task_sources import discover, materialise, reference_candidate  # noqa: E402


def first_line(message: str, paths: list[Path], name: str = "") -> str:
    """A reason without the problem's own path and name, so equal reasons count together."""
    text = message.strip().splitlines()[0] if message.strip() else ""
    for p in paths:
        text = text.replace(str(p.resolve()), "PROBLEM").replace(str(p), "PROBLEM")
    if re.search(r"[_\d]", name):  # a definition's or problem's own name (not a word like "multi")
        text = text.replace(name, "NAME")
    text = re.sub(r"/\S*/(task\.yml|reference\.py|[\w.-]+\.py|[\w.-]+\.json)\b", r"\1", text)
    return text if len(text) <= 300 else text[:297] + "..."


def input_mb(task_dir: Path, spec: dict) -> float | None:
    """The largest input set of the task's workloads in MB, sized on the meta device; None where unknown. The task's
    reference is imported into this process and taken out again (its modules, its sys.path entries)."""
    from ksearch_graph.harness.judge.input_sizes import estimate
    from ksearch_graph.harness.modules import load_module

    modules, path = set(sys.modules), list(sys.path)
    try:
        ref = load_module(f"ksearch_coverage_{abs(hash(str(task_dir)))}", str(task_dir / spec["reference"]))
        sizes = [estimate(ref, w["params"], spec.get("entry_kind", "function")) for w in spec["workloads"]]
    except BaseException:  # noqa: BLE001 (a reference that does not import here: size unknown)
        return None
    finally:  # the task's own modules out again (reference, task, utils); libraries it imported stay
        for name in set(sys.modules) - modules:
            if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(task_dir)):
                del sys.modules[name]
        sys.path[:] = path
    known = [s[0] for s in sizes if s is not None]
    return max(known) / 1e6 if known else None


def survey(kind: str, path: Path, out_dir: Path, device: str, max_mb: float) -> dict:
    """Materialise one problem and say what this machine can do with it (nothing is run but make_inputs on meta)."""
    from ksearch_graph.harness.requirements import unmet_requirement
    from ksearch_graph.harness.tasks import read_task

    row = {"kind": kind, "path": str(path), "name": path.stem if path.is_file() else path.name}
    try:
        task_dir = materialise(path, out_dir)
        load_task(task_dir)
    except TaskError as e:
        return row | {"outcome": "refused", "reason": first_line(str(e), [path, path.parent], row["name"])}
    spec = json.loads((task_dir / "task.json").read_text())
    row |= {"task_dir": str(task_dir), "workloads": len(spec["workloads"]), "requires": spec.get("requires", {}),
            # fields a judge must read for this task's reference to pass (harness/task_checks.py, writable.py)
            "judge_fields": [f for f in ("check", "writable_inputs") if spec.get(f)]}
    why = unmet_requirement(read_task(str(task_dir), None), device)
    if why:
        return row | {"outcome": "unavailable", "reason": why}
    mb = input_mb(task_dir, spec)
    row["input_mb"] = None if mb is None else round(mb, 1)
    if mb is not None and mb > max_mb:
        return row | {"outcome": "too large", "reason": f"one input set is {mb:.0f} MB, over --max-input-mb {max_mb:g}"}
    return row | {"outcome": "not evaluated"}


def evaluate(row: dict, timeout_s: float, budget_s: float, memory_gb: float) -> dict:
    """The problem's reference, evaluated by the harness as a candidate on every workload."""
    from ksearch_graph.harness.parent.client import SubprocessEvaluator

    task_dir = Path(row["task_dir"])
    task = load_task(task_dir)
    t0 = time.monotonic()
    result = SubprocessEvaluator(timeout_s=timeout_s, time_budget_s=budget_s, workloads="all",
                                 memory_limit_gb=memory_gb, reuse_reference_timings_s=0).evaluate(
        task, reference_candidate(row["kind"], task_dir), attempt_id="reference")
    status = result.status.value
    out = {"status": status, "wall_s": round(time.monotonic() - t0, 1), "flags": result.flags}
    if status == "passed":
        return row | out | {"outcome": "passed"}
    if status == "unavailable":
        return row | out | {"outcome": "unavailable", "reason": first_line(result.log_excerpt, [task_dir])}
    unread = f" [task.json has {' and '.join(row['judge_fields'])}: a judge that reads them?]" \
        if row.get("judge_fields") else ""
    return row | out | {"outcome": "failed",
                        "reason": f"{status}: {first_line(result.log_excerpt, [task_dir])}{unread}"}


def table(rows: list[dict], sources: list[str]) -> list[str]:
    lines = ["| source | problems | materialised | reference passed | reference failed | unavailable | too large | "
             "not evaluated | refused |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for source in sources + ["all"]:
        mine = [r for r in rows if source == "all" or r["source"] == source]
        if source == "all" and len(sources) == 1:
            break
        count = Counter(r["outcome"] for r in mine)
        lines.append(f"| {source} | {len(mine)} | {len(mine) - count['refused']} | {count['passed']} | "
                     f"{count['failed']} | {count['unavailable']} | {count['too large']} | {count['not evaluated']} | "
                     f"{count['refused']} |")
    for outcome in ("refused", "unavailable", "too large", "failed"):
        reasons = Counter(r["reason"] for r in rows if r["outcome"] == outcome)
        if reasons:
            lines += ["", f"{outcome}:"]
            for reason, n in reasons.most_common():
                names = sorted(r["name"] for r in rows if r["outcome"] == outcome and r["reason"] == reason)
                shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
                lines.append(f"- {n} x {reason} ({shown})")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sources", nargs="+", type=Path)
    p.add_argument("--evaluate", action="store_true", help="evaluate each available problem's reference")
    p.add_argument("--sample", type=int, default=0, help="evaluate only this many per source, drawn at random")
    p.add_argument("--seed", type=int, default=0, help="the --sample draw")
    p.add_argument("--only", default="", help="a regular expression the problem's path must match")
    p.add_argument("--jobs", type=int, default=1, help="evaluations at once")
    p.add_argument("--timeout-s", type=float, default=300, help="per evaluation")
    p.add_argument("--time-budget-s", type=float, default=0.05, help="timing budget per workload")
    p.add_argument("--memory-limit-gb", type=float, default=16)
    p.add_argument("--max-input-mb", type=float, default=4096, help="evaluate no problem whose input set is larger")
    p.add_argument("--deadline-s", type=float, default=0, help="start no evaluation after this many seconds (0: none)")
    p.add_argument("--json", type=Path)
    p.add_argument("--markdown", type=Path)
    args = p.parse_args(argv)
    started = time.monotonic()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="ksearch-coverage-") as tmp:
        for source in args.sources:
            found = [(k, path) for k, path in discover(source) if re.search(args.only, str(path))]
            print(f"[coverage] {source}: {len(found)} problems", file=sys.stderr, flush=True)
            for kind, path in found:
                row = survey(kind, path, Path(tmp) / f"{len(rows)}", device, args.max_input_mb)
                rows.append(row | {"source": str(source)})
        if args.evaluate:
            todo = [r for r in rows if r["outcome"] == "not evaluated"]
            if args.sample:
                draw = random.Random(args.seed)
                todo = [r for source in map(str, args.sources) for r in sorted(draw.sample(
                    [r for r in todo if r["source"] == source],
                    min(args.sample, sum(r["source"] == source for r in todo))), key=lambda r: r["path"])]
            print(f"[coverage] evaluating {len(todo)} references on {device}, {args.jobs} at a time", file=sys.stderr,
                  flush=True)

            def run(row: dict) -> dict:
                if args.deadline_s and time.monotonic() - started > args.deadline_s:
                    return row | {"reason": "not evaluated: past --deadline-s"}
                return evaluate(row, args.timeout_s, args.time_budget_s, args.memory_limit_gb)

            with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
                futures = {pool.submit(run, r): r for r in todo}
                for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
                    old, new = futures[future], future.result()
                    rows[rows.index(old)] = new
                    print(f"[coverage {time.monotonic() - started:5.0f}s] {done}/{len(todo)} {new['name']}: "
                          f"{new.get('status', new['outcome'])} {new.get('wall_s', '')}", file=sys.stderr, flush=True)
    for r in rows:
        r.pop("task_dir", None)
    lines = table(rows, [str(s) for s in args.sources])
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    if args.json:
        args.json.write_text(json.dumps({"device": device, "torch": torch.__version__, "argv": sys.argv[1:],
                                         "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
