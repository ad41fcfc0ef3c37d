"""Where the time between two timed calls goes, for a task's timed workloads (default: examples/trimul).

    python tools/diagnostics/diagnose_burst_gap.py [TASK_DIR] [--solution FILE]

Between timed calls of a burst (``timing.timed_burst``) the candidate's process makes the next call's inputs, takes a copy
of the last output and fingerprints it, and the launch cover and two idle probes precede the call. For a
power-limited workload, fillers keep the GPU busy for FILL_DUTY of that time (timer.Timer.fill), so every millisecond of
gap costs FILL_DUTY / (1 - FILL_DUTY) more in filler calls: this prints each part, on the device, per workload.
The solution (default: the task's seed) stands in for a candidate.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> None:
    from ksearch_graph.harness import _torch, tasks, tensors, timer

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("task", nargs="?", default=str(ROOT / "examples" / "trimul"))
    p.add_argument("--solution", help="the candidate's file (default: the task's seed solution)")
    args = p.parse_args()
    task = json.loads(Path(args.task, "task.json").read_text())
    if not (args.solution or task.get("seed_solution")):
        p.error("this task has no seed solution: name one with --solution")
    torch = _torch.load_torch()
    ref = tasks.load_module("ref", os.path.join(args.task, task["reference"]))
    solution = tasks.load_module("solution", args.solution or os.path.join(args.task, task["seed_solution"]))
    entry = getattr(solution, task["entry_point"])
    kind = task.get("entry_kind", "function")
    timer = timer.Timer("cuda")
    timed = task.get("feedback_workloads") or [w["name"] for w in task["workloads"] if w.get("timed", True)]

    def ms(fn, repeat=5):
        """The host's wall time of fn() with the device idle before and after: what a burst's host waits."""
        best = float("inf")
        for _ in range(repeat):
            timer.sync()
            t0 = time.perf_counter()
            got = fn()
            timer.sync()
            best = min(best, (time.perf_counter() - t0) * 1e3)
        return best, got

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, task {task['name']}")
    print("| workload | call ms | inputs ms | output copy ms | fingerprint ms | cover + probes ms | output MB |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for w in task["workloads"]:
        if w["name"] not in timed:
            continue
        inputs_ms, inputs = ms(lambda: ref.make_inputs(w["params"], 7, "cuda"))  # noqa: B023
        fn, fargs = tasks.prepare(entry, inputs, kind, "cuda")
        fn(*fargs)  # compile, autotune
        call_ms, out = ms(lambda: fn(*fargs))  # noqa: B023
        copy_ms, _ = ms(lambda: tensors.snapshot(out, timer.sync))  # noqa: B023
        print_ms, _ = ms(lambda: tensors.fingerprint(out))  # noqa: B023
        cover_ms, _ = ms(lambda: (timer.idle_gap_us(), timer.idle_gap_us(), timer.cover()))
        size = sum(t.numel() * t.element_size() for t in tensors.as_tensors(out)) / 1e6
        print(f"| {w['name']} | {call_ms:.2f} | {inputs_ms:.2f} | {copy_ms:.2f} | {print_ms:.2f} | {cover_ms:.2f} | "
              f"{size:.0f} |", flush=True)


if __name__ == "__main__":
    main()
