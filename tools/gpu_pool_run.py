"""A real search through the local evaluation pool on a GPU host: evaluations per hour and how busy the GPU was.

    python tools/gpu_pool_run.py [--task examples/gqa_paged_decode_h32_kv4_d128_ps1] [--iterations 12]
        [--configs 1x1,2x1,4x1] [--lanes N] [--gpus 0,1,...] [--out DIR]

Each config "KxS" is one `ksearch run --offline -k K --samples S` in its own run directory under --out (default
runs/gpu-pool-<time>), on the pool of the visible GPUs (or --gpus), with the pool's default lanes per GPU (k x S, at
most 4) unless --lanes is given. The offline planner needs no LLM, so the figures are the pool's and the graph's:

- evaluations per hour: every evaluation the run recorded, the seed included, over the command's wall time;
- GPU busy: the union, per GPU, of the judges' holds on it (``device_spans``: timing alone, checking side by side;
  harness/judge/gpu_share.py), over the search (first evaluation's start to the last one's end) and over the whole
  command (start-up and preflight included); "timing" is the timing holds' share alone, "any hold" adds the shared
  holds of starting and stopping the processes (making and dropping CUDA contexts);
- the mean of each phase of an evaluation (what its seconds went to) and its wall time as the search paid it.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PHASES = ("startup", "imports", "waiting_for_runner", "reference_timing", "waiting_for_compile", "reference",
          "correctness", "timing", "waiting_for_device")


def union_s(spans: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Seconds of [lo, hi] covered by at least one span."""
    total, end = 0.0, lo
    for a, b in sorted((max(a, lo), min(b, hi)) for a, b in spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def one(task: str, iterations: int, k: int, samples: int, lanes: int | None, gpus: str | None, run_dir: Path) -> dict:
    cmd = [sys.executable, "-m", "ksearch_graph.cli.main", "run", task, "--offline", "--iterations", str(iterations),
           "-k", str(k), "--samples", str(samples), "--run-dir", str(run_dir), "--quiet"]
    if gpus:
        cmd += ["--gpus", gpus]
    if lanes:
        cmd += ["--lanes-per-gpu", str(lanes)]
    started_wall, started = time.time(), time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.monotonic() - started
    ended_wall = started_wall + wall
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    with sqlite3.connect(str(run_dir / "store.sqlite")) as db:
        rows = [json.loads(r[0]) for r in db.execute("select result from attempts").fetchall()]
    spans: dict[str, list] = defaultdict(list)  # per GPU: (what, start, end)
    phases: dict[str, list[float]] = defaultdict(list)
    models = set()
    for data in rows:
        env = data.get("environment", {})
        gpu = env.get("pool_slot", "?").split(".")[0]
        spans[gpu] += data.get("device_spans") or []
        models.add(env.get("gpu_model") or env.get("gpu"))
        for name in PHASES:
            phases[name].append(data.get("phases", {}).get(name, 0.0))
        phases["wall_s"].append(data.get("wall_s", 0.0))
    every = [s for ss in spans.values() for s in ss]
    first = min((s[1] for s in every), default=started_wall)
    last = max((s[2] for s in every), default=ended_wall)

    def share(lo: float, hi: float, kinds: tuple[str, ...]) -> float:
        covered = sum(union_s([(a, b) for what, a, b in ss if what in kinds], lo, hi) for ss in spans.values())
        return round(covered / max(1e-9, (hi - lo) * max(1, len(spans))), 3)

    return {
        "config": f"k={k} samples={samples}" + (f" lanes={lanes}" if lanes else ""), "evaluations": len(rows),
        "passed": sum(r.get("status") == "passed" for r in rows),
        "suspicious": sum(r.get("status") == "suspicious" for r in rows), "wall_s": round(wall, 1),
        "evaluations_per_hour": round(len(rows) / wall * 3600, 1),
        "gpu_busy_search": share(first, last, ("timing", "checking")),
        "gpu_timing_search": share(first, last, ("timing",)),
        "gpu_held_search": share(first, last, ("timing", "checking", "starting", "stopping")),
        "gpu_busy_command": share(started_wall, ended_wall, ("timing", "checking")),
        "phases_mean_s": {name: round(statistics.fmean(v), 2) for name, v in phases.items() if v},
        "gpus": sorted(spans), "gpu_models": sorted(m for m in models if m), "run_dir": str(run_dir),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default=str(REPO / "examples" / "gqa_paged_decode_h32_kv4_d128_ps1"))
    ap.add_argument("--iterations", type=int, default=12)
    ap.add_argument("--configs", default="1x1,2x1,4x1", help="comma-separated KxS: k cycles, S samples")
    ap.add_argument("--lanes", type=int, help="--lanes-per-gpu for every config (default: the pool's)")
    ap.add_argument("--gpus", help="GPU indices for the pool (default: every visible GPU)")
    ap.add_argument("--out", default=f"runs/gpu-pool-{time.strftime('%Y%m%d-%H%M%S')}")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for spec in args.configs.split(","):
        k, samples = (int(x) for x in spec.split("x"))
        row = one(args.task, args.iterations, k, samples, args.lanes, args.gpus, out / f"k{k}s{samples}")
        rows.append(row)
        print(json.dumps(row), flush=True)
    base = rows[0]["evaluations_per_hour"]
    print("\n| config | evaluations | passed | suspicious | wall (s) | evaluations/hour | x first | GPU busy (search) |"
          " timing alone | any hold | GPU busy (command) |\n|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['config']} | {r['evaluations']} | {r['passed']} | {r['suspicious']} | {r['wall_s']} | "
              f"{r['evaluations_per_hour']} | {r['evaluations_per_hour'] / base:.2f} | {r['gpu_busy_search']:.0%} | "
              f"{r['gpu_timing_search']:.0%} | {r['gpu_held_search']:.0%} | {r['gpu_busy_command']:.0%} |")
    print("\n| config | " + " | ".join(rows[0]["phases_mean_s"]) + " |\n|---|" + "---|" * len(rows[0]["phases_mean_s"]))
    for r in rows:
        print(f"| {r['config']} | " + " | ".join(str(v) for v in r["phases_mean_s"].values()) + " |")
    (out / "gpu_pool_run.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
