"""How fast an idle H200 lowers its clocks, and how much load before a timed call brings them back.

    python tools/diagnose_small_kernel_timing.py      # on the GPU host, from the repository root (~1 min)

Session 6 found why the cheat task's skinny workload (relu(x @ w), 16x4096 @ 4096x2048 fp32: 31 us back to back)
read 105-212 us in the harness's timed calls: its inputs are made on the CPU (~50 ms), the GPU idles meanwhile, and
the 256 MB flush before the call does not bring the clocks back (BENCHMARKS.md, session 6). This prints, per kernel,
the timed call's median / max device time and the SM clock before it, after an idle of 0-50 ms, with 0-3 ms of
load between the idle and the call: the kernel's own calls (``Timer.back_to_back``; session 6 measured these), or
the harness's memory writes (``Timer.wake``, what timed calls get); then whole evaluations of the cheat task's
honest candidate through SubprocessEvaluator.
"""

from __future__ import annotations

import ctypes
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def idle_study() -> None:
    import torch

    from ksearch_graph import _candidate_runner as rl

    rl.load_torch()
    timer = rl.Timer("cuda")
    clock = timer.clock

    def mhz() -> int:
        now = ctypes.c_uint(0)
        if clock is None or clock.lib is None:
            return 0
        clock.lib.nvmlDeviceGetClockInfo(clock.handle, clock.SM, ctypes.byref(now))
        return now.value

    g = torch.Generator(device="cuda").manual_seed(1)
    kernels = {
        "skinny fp32 16x4096x2048": (lambda x, w: torch.relu(x @ w), lambda: (
            torch.randn(16, 4096, generator=g, device="cuda"), torch.randn(4096, 2048, generator=g, device="cuda"))),
        "matmul bf16 3072": (torch.matmul, lambda: tuple(
            torch.randn(3072, 3072, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))),
    }
    warms = [("none", 0.0)] + [(f"{kind} {ms} ms", ms) for kind in ("calls", "writes") for ms in (0.5, 1.0, 3.0)]
    print(f"top SM clock {clock.top if clock else None} MHz; cells: median / max us (SM clock before the warm-up)")
    print("| kernel | idle | " + " | ".join(label for label, _ in warms) + " |")
    for name, (fn, make) in kernels.items():
        heat = make()
        timer.heat(fn, heat, first=True)
        for idle_ms in (0, 1, 3, 10, 50):
            cells = []
            for label, warm_ms in warms:
                us, clocks = [], []
                for _ in range(10):
                    args = make()
                    timer.sync()
                    time.sleep(idle_ms / 1e3)
                    clocks.append(mhz())
                    if label.startswith("calls"):
                        timer.back_to_back(fn, heat, warm_ms / 1e3)
                    rl.WARM_S = warm_ms / 1e3  # Timer.time wakes the device with this much writing...
                    timer.busy_at = -1.0 if label.startswith("writes") else timer.perf()  # ...when it idled
                    us.append(timer.time(fn, args)[1])
                cells.append(f"{statistics.median(us):.1f} / {max(us):.0f} ({statistics.median(clocks):.0f})")
            print(f"| {name} | {idle_ms} ms | " + " | ".join(cells) + " |")


def evaluations() -> None:
    from ksearch_graph.evaluation import SubprocessEvaluator
    from ksearch_graph.task import load_task

    folder = Path(tempfile.mkdtemp()) / "task"
    shutil.copytree(ROOT / "tests" / "cheats" / "task", folder)
    spec = json.loads((folder / "task.json").read_text())
    spec["workloads"] = [{"name": "square", "params": {"m": 2048, "k": 2048, "n": 2048}},
                         {"name": "skinny", "params": {"m": 16, "k": 4096, "n": 2048}}]
    (folder / "task.json").write_text(json.dumps(spec))
    task = load_task(folder)
    honest = {"kernel.py": (ROOT / "tests" / "cheats" / "honest.py").read_text()}
    ev = SubprocessEvaluator(timeout_s=300, time_budget_s=0.5, workloads="all", prestart=False)
    for i in range(2):
        r = ev.evaluate(task, honest, attempt_id=f"honest{i}")
        cells = [f"{w.workload}: median {w.median_us or 0:.1f} us, mean {w.latency_us or 0:.1f} us, reference "
                 f"{w.reference_us or 0:.1f} us, runs {w.runs}" for w in r.workloads]
        print(f"evaluation {i + 1}: {r.status.value}; " + "; ".join(cells) + f"; {r.log_excerpt[:200]!r}")


if __name__ == "__main__":
    idle_study()
    evaluations()
