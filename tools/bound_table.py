"""The judge's bound on forged timings, measured: for each call length, the largest factor by which a candidate that
controls its whole process can under-report and still pass.

    python tools/bound_table.py [--lengths-us 100,1000,10000] [--factors 1.25,1.5,2,3,5,10,100] [--every N] [--out DIR]

The forger (written here) blinds the in-process guards at import (it empties the integrity check's snapshot), drops
the launch cover's hold, and rewrites every ``Done`` message to report its call's time divided by the factor: it
goes through exactly the honest runner's steps otherwise, so its overhead is the calibration's and only the judge's
clock stands against it (the tightest attack on the bound). Each timed call does the cheat task's matmul (at a tiny
size) plus the call length of work (a CPU spin on CPU, ``torch.cuda._sleep`` on a GPU). Each (length, factor) is one evaluation of the cheat task (tests/cheats/task, with 16x16
workloads); a factor passes when the evaluation does, and its gain is the same forger's latency at factor 1 over
its latency then (each call is counted at no less than the judge's clock leaves, so a passing lie can gain less
than its factor). Prints the table and writes bound_table.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FORGER = '''
import sys, time
import torch

LENGTH_US, FACTOR, EVERY = {length}, {factor}, {every}

# At import: walk up to the runner (no audit event), empty the integrity check's snapshot (it then watches nothing),
# drop the launch cover's hold, and make every Done message report its call's time divided by FACTOR.
frame = sys._getframe(0)
while frame is not None and not hasattr(frame.f_locals.get("self"), "guards"):
    frame = frame.f_back
runner = frame.f_locals["self"]
runner.guards.integrity.integrity.kept.clear()
runner.guards.integrity.integrity.types.clear()
runner.timer.cover = lambda: None
channel_type = type(runner.channel)
real_send = channel_type.send


def send(self, msg, *fds):
    if type(msg).__name__ == "Done" and msg.index % EVERY == EVERY // 2:
        msg = msg._replace(times=[msg.times[0] / FACTOR, *msg.times[1:3], *(t / FACTOR for t in msg.times[3:])])
    return real_send(self, msg, *fds)


channel_type.send = send
CYCLES = int(LENGTH_US * 1.98e3)  # GPU clock cycles of the spin (about 1.98 GHz under load)


def kernel(x, w):
    out = torch.relu(x @ w)
    if out.is_cuda:
        torch.cuda._sleep(CYCLES)
    else:
        end = time.process_time() + LENGTH_US * 1e-6
        while time.process_time() < end:
            pass
    return out
'''


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths-us", default="100,1000,10000")
    p.add_argument("--factors", default="1.25,1.5,2,3,5,10,100")
    p.add_argument("--out", default=".")
    p.add_argument("--budget-s", type=float, default=0.2)
    p.add_argument("--every", type=int, default=1, help="lie on one call in this many (1: every call; 3: a minority "
                   "that keeps each burst's median honest)")
    args = p.parse_args()
    from ksearch_graph.harness.parent.client import SubprocessEvaluator
    from ksearch_graph.tasks.task import load_task

    folder = Path(tempfile.mkdtemp(prefix="bound-")) / "task"
    shutil.copytree(ROOT / "tests" / "cheats" / "task", folder)
    spec = json.loads((folder / "task.json").read_text())
    spec["workloads"] = [{"name": "tiny", "params": {"m": 16, "k": 16, "n": 16}}]
    (folder / "task.json").write_text(json.dumps(spec))
    task = load_task(folder)
    ev = SubprocessEvaluator(timeout_s=300, time_budget_s=args.budget_s)
    rows = []

    def evaluate(length: float, factor: float):
        t0 = time.perf_counter()
        r = ev.evaluate(task, {"kernel.py": FORGER.format(length=length, factor=factor, every=args.every)},
                        attempt_id=f"bound-{length:g}-{factor:g}")
        latency = f"{r.latency_us:.0f} us" if r.latency_us else "-"
        print(f"{length:g} us x{factor:g}: {r.status.value}, latency {latency} ({time.perf_counter() - t0:.1f} s) "
              f"{r.log_excerpt[:160]!r}", flush=True)
        return r

    for length in (float(x) for x in args.lengths_us.split(",")):
        # The same forger telling the truth: what a lie that passes is measured against (the judge counts each call
        # at no less than its clock leaves, so a passing lie may gain less than its factor).
        honest = evaluate(length, 1.0)
        row = {"length_us": length, "honest_us": honest.latency_us if honest.passed else None, "passed": [],
               "caught": {}, "gain": {}}
        for factor in (float(x) for x in args.factors.split(",")):
            r = evaluate(length, factor)
            if r.passed:
                row["passed"].append(factor)
                if row["honest_us"] and r.latency_us:
                    row["gain"][str(factor)] = round(row["honest_us"] / r.latency_us, 3)
            else:
                row["caught"][str(factor)] = r.status.value
        row["largest_passing"] = max(row["passed"], default=None)
        row["largest_gain"] = max(row["gain"].values(), default=None)
        rows.append(row)
    ev.close()
    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    report = {"date": time.strftime("%Y-%m-%d"), "device": device, "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bound_table.json").write_text(json.dumps(report, indent=1))
    print(f"\n{device}: largest under-reporting factor that passed, and the largest gain it bought, per call length")
    for row in rows:
        print(f"  {row['length_us']:>8g} us: {row['largest_passing'] or 'none (every factor tried was caught)'}, "
              f"gain {row['largest_gain'] or '-'}  (caught: {row['caught']})")
    shutil.rmtree(folder.parent, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
