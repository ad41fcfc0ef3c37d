"""A real search through the local evaluation pool on a GPU host: evaluations per hour, k = 1 against k >= 4.

    python tools/gpu_pool_run.py [--task examples/gqa_paged_decode_h32_kv4_d128_ps1] [--iterations 12]
        [--configs 1x1,4x1,4x2] [--gpus 0,1,...] [--out DIR]

Each config "KxS" is one `ksearch run --offline -k K --samples S` in its own run directory under --out (default
runs/gpu-pool-<time>), on the pool of the visible GPUs (or --gpus). The offline planner needs no LLM, so the
figures are the pool's and the graph's: wall time, evaluations per hour (every evaluation the run recorded, the
seed included, over the run's wall time), and per GPU the share of the run it was leased (from the attempts'
recorded pool slots and evaluation wall times; a confirmation re-run is not counted). On a 1-GPU host k > 1 overlaps the offline planner and the graph with
the evaluations only; on an N-GPU host the evaluations themselves run N at a time.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def one(task: str, iterations: int, k: int, samples: int, gpus: str | None, run_dir: Path) -> dict:
    cmd = [sys.executable, "-m", "ksearch_graph.cli.main", "run", task, "--offline", "--iterations", str(iterations),
           "-k", str(k), "--samples", str(samples), "--run-dir", str(run_dir), "--quiet"]
    if gpus:
        cmd += ["--gpus", gpus]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    with sqlite3.connect(str(run_dir / "store.sqlite")) as db:
        rows = db.execute("select status, eval_s, result from attempts").fetchall()
    per_slot: dict[str, float] = defaultdict(float)
    models = set()
    for _, _, result in rows:
        data = json.loads(result)
        env = data.get("environment", {})
        per_slot[env.get("pool_slot", "?")] += data.get("wall_s", 0.0)  # the evaluation itself, not its wait for a lease
        models.add(env.get("gpu_model") or env.get("gpu"))
    return {
        "config": f"k={k} samples={samples}", "evaluations": len(rows), "passed": sum(r[0] == "passed" for r in rows),
        "wall_s": round(wall, 1), "evaluations_per_hour": round(len(rows) / wall * 3600, 1),
        "busy_per_slot": {slot: round(s / wall, 3) for slot, s in sorted(per_slot.items())},
        "gpu_models": sorted(m for m in models if m), "run_dir": str(run_dir),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default=str(REPO / "examples" / "gqa_paged_decode_h32_kv4_d128_ps1"))
    ap.add_argument("--iterations", type=int, default=12)
    ap.add_argument("--configs", default="1x1,4x1,4x2", help="comma-separated KxS: k cycles, S samples")
    ap.add_argument("--gpus", help="GPU indices for the pool (default: every visible GPU)")
    ap.add_argument("--out", default=f"runs/gpu-pool-{time.strftime('%Y%m%d-%H%M%S')}")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for spec in args.configs.split(","):
        k, samples = (int(x) for x in spec.split("x"))
        row = one(args.task, args.iterations, k, samples, args.gpus, out / f"k{k}s{samples}")
        rows.append(row)
        print(json.dumps(row), flush=True)
    base = rows[0]["evaluations_per_hour"]
    print("\n| config | evaluations | passed | wall (s) | evaluations/hour | x first | GPU busy |\n|---|---|---|---|---|---|---|")
    for r in rows:
        busy = ", ".join(f"{s} {v:.0%}" for s, v in r["busy_per_slot"].items())
        print(f"| {r['config']} | {r['evaluations']} | {r['passed']} | {r['wall_s']} | {r['evaluations_per_hour']} | "
              f"{r['evaluations_per_hour'] / base:.2f} | {busy} |")
    (out / "gpu_pool_run.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
