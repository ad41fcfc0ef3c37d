"""Why small kernels read slow after the host waited, and what covers it.

    python tools/diagnose_small_kernel_timing.py      # on the GPU host, from the repository root (~1 min)

Session 6 found the cheat task's skinny workload (relu(x @ w), 16x4096 @ 4096x2048 fp32: 31 us back to back) read
105-212 us in timed calls after its inputs were made on the CPU (~50 ms); session 7 found why: the host then takes
130-230 us to launch the call, and the device idles between the start event and the call's kernels (BENCHMARKS.md).
This prints:

1. per kernel, the timed call's median / max device time, the host's median time to launch the call, and the SM
   clock before it, after an idle of 0-50 ms (the host asleep), with one of: nothing but the 256 MB flush (``zero_``,
   as before session 7), the launch cover (``Timer.cover``: every SM held 0.5 ms, then the flush), or 1 ms of the
   kernel's own calls first (``Timer.back_to_back``, which warms the host's launch path);
2. whole evaluations of the cheat task's honest candidate through SubprocessEvaluator.

Power-limited kernels (fillers, the heat's verdict, against do_bench) are tools/diagnose_power_limit.py's.
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


def warm_up(timer, label: str, fn, heat_args) -> None:
    """What runs before ``timer.time`` (see the module's docstring)."""
    if label.startswith("calls"):
        timer.back_to_back(fn, heat_args, 1e-3)
    timer.cover = timer.launch_cover if "cover" in label else (lambda: timer.zero_(timer.flush))


WARMS = ["flush only", "cover", "calls 1 ms + flush only", "calls 1 ms + cover"]


def idle_study(timer, torch) -> None:
    gauge = timer.gauge

    def mhz() -> int:
        now = ctypes.c_uint(0)
        if gauge is None or gauge.lib is None:
            return 0
        gauge.lib.nvmlDeviceGetClockInfo(gauge.handle, gauge.SM, ctypes.byref(now))
        return now.value

    g = torch.Generator(device="cuda").manual_seed(1)
    kernels = {
        "skinny fp32 16x4096x2048": (lambda x, w: torch.relu(x @ w), lambda: (
            torch.randn(16, 4096, generator=g, device="cuda"), torch.randn(4096, 2048, generator=g, device="cuda"))),
        "matmul bf16 3072": (torch.matmul, lambda: tuple(
            torch.randn(3072, 3072, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))),
    }
    print(f"top SM clock {gauge.top if gauge else None} MHz; cells: median / max us of device time (median host us "
          "of launching the call; SM clock before the warm-up)")
    print("| kernel | idle | " + " | ".join(WARMS) + " |")
    print("| --- | --- | " + "--- | " * len(WARMS))
    for name, (fn, make) in kernels.items():
        heat = make()
        timer.heat(fn, heat, first=True)
        launch = []

        def launched(*args):
            t0 = time.perf_counter()
            out = fn(*args)
            launch.append((time.perf_counter() - t0) * 1e6)
            return out

        for idle_ms in (0, 10, 50):
            cells = []
            for label in WARMS:
                us, clocks = [], []
                launch.clear()
                for _ in range(10):
                    args = make()
                    timer.sync()
                    time.sleep(idle_ms / 1e3)
                    clocks.append(mhz())
                    warm_up(timer, label, fn, heat)
                    us.append(timer.time(launched, args)[1])
                cells.append(f"{statistics.median(us):.1f} / {max(us):.0f} ({statistics.median(launch):.0f}; "
                             f"{statistics.median(clocks):.0f})")
            print(f"| {name} | {idle_ms} ms | " + " | ".join(cells) + " |", flush=True)


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
    from ksearch_graph import _candidate_runner as rl

    rl.load_torch()
    timer = rl.Timer("cuda")
    print(f"launch cover: {timer.cover_kind}")
    timer.launch_cover = timer.cover
    idle_study(timer, rl.torch)
    evaluations()
