"""Why small kernels read slow after an idle GPU, and what load before a timed call brings them back.

    python tools/diagnose_small_kernel_timing.py      # on the GPU host, from the repository root (~1 min)

Session 6 found why the cheat task's skinny workload (relu(x @ w), 16x4096 @ 4096x2048 fp32: 31 us back to back)
read 105-212 us in the harness's timed calls: its inputs are made on the CPU (~50 ms), the GPU idles meanwhile, and
the 256 MB flush before the call does not bring it back (BENCHMARKS.md, sessions 6-7). This prints:

1. per kernel, the timed call's median / max device time and the SM clock before it, after an idle of 0-50 ms, with
   0-3 ms of load between the idle and the call: the kernel's own calls (``Timer.back_to_back``), the harness's
   matmuls (``Timer.wake``, what timed calls get), or memory writes (``zero_``, a memset: session 6's wake-up);
2. a power-limited kernel (an 8192^3 bf16 matmul) timed as a burst does it, after its heat, with fillers before each
   call's inputs, then each of those wake-ups (or none) just before the call, against ``triton.testing.do_bench``;
3. whole evaluations of the cheat task's honest candidate through SubprocessEvaluator.
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


def writes(timer, seconds: float) -> None:
    """Session 6's wake-up: memory writes, two ahead of the host."""
    marks, until = [], timer.perf() + seconds
    while timer.perf() < until:
        timer.zero_(timer.flush)
        marks.append(timer.Event())
        timer.record(marks[-1])
        if len(marks) > 2:
            timer.event_sync(marks[-3])
    timer.sync()


def warm_up(rl, timer, label: str, seconds: float, fn, heat_args) -> None:
    """Load of one kind just before ``timer.time``; the harness's matmuls run inside it (``Timer.wake``), and so does
    the spin that covers the call's launch (``COVER_S``) when the label says "cover"."""
    if label.startswith("calls"):
        timer.back_to_back(fn, heat_args, seconds)
    elif label.startswith("writes"):
        writes(timer, seconds)
    rl.WARM_S = seconds
    timer.busy_at = -1.0 if label.startswith("harness") else timer.perf()
    cover_s = rl.COVER_S * (2 if "cover 1 ms" in label else 1) if "cover" in label else 0.0
    timer.cover_cycles = int(cover_s * (timer.clock.top or 2000) * 1e6)


WARMS = [("none", 0.0), ("cover", 0.0), ("cover 1 ms", 0.0), ("calls 1 ms", 1e-3), ("harness 2 ms", 2e-3),
         ("harness 2 ms + cover", 2e-3), ("writes 2 ms + cover", 2e-3)]


def idle_study(rl, timer, torch) -> None:
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
    print(f"top SM clock {clock.top if clock else None} MHz; cells: median / max us of device time (median host us "
          "of launching the call; SM clock before the warm-up)")
    print("| kernel | idle | " + " | ".join(label for label, _ in WARMS) + " |")
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
            for label, seconds in WARMS:
                us, clocks = [], []
                launch.clear()
                for _ in range(10):
                    args = make()
                    timer.sync()
                    time.sleep(idle_ms / 1e3)
                    clocks.append(mhz())
                    warm_up(rl, timer, label, seconds, fn, heat)
                    us.append(timer.time(launched, args)[1])
                cells.append(f"{statistics.median(us):.1f} / {max(us):.0f} ({statistics.median(launch):.0f}; "
                             f"{statistics.median(clocks):.0f})")
            print(f"| {name} | {idle_ms} ms | " + " | ".join(cells) + " |", flush=True)


def limited_study(rl, timer, torch) -> None:
    import triton.testing

    g = torch.Generator(device="cuda").manual_seed(2)

    def make():
        return tuple(torch.randn(8192, 8192, generator=g, device="cuda").to(torch.bfloat16) for _ in range(2))

    fn, heat = torch.matmul, make()
    timer.cover_cycles = 0
    timer.heat(fn, heat, first=True)
    under_load = []
    for _ in range(20):  # ~30 ms of calls queued, the clock read while they run, then after a synchronize
        fn(*heat)
    for _ in range(5):
        time.sleep(3e-3)
        under_load.append(timer.clock.limited())
    timer.sync()
    print(f"\n8192^3 bf16 matmul: heat says power-limited {timer.limited}; NVML under load says limited "
          f"{under_load}, after a synchronize {timer.clock.limited()}; 30 timed calls per row, fillers before the inputs")
    print("| wake-up before each timed call | mean us | median us | std us |")
    print("| --- | --- | --- | --- |")
    for label, seconds in [("none", 0.0), ("cover", 0.0), ("harness 2 ms + cover", 2e-3), ("calls 2 ms", 2e-3)] * 2:
        us, gap_s = [], 0.0
        for k in range(30):
            if k:
                timer.fill(fn, heat, gap_s, us[-1])
            t0 = timer.perf()
            args = make()
            warm_up(rl, timer, label, seconds, fn, heat)
            us.append(timer.time(fn, args)[1])
            del args
            gap_s = max(0.0, timer.perf() - t0 - us[-1] * 1e-6)
        print(f"| {label} | {statistics.fmean(us):.1f} | {statistics.median(us):.1f} | {statistics.stdev(us):.1f} |",
              flush=True)
    ms = triton.testing.do_bench(lambda: fn(*heat), warmup=50, rep=300, return_mode="mean")
    print(f"do_bench (cold L2, 300 ms): {ms * 1e3:.1f} us")


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
    idle_study(rl, timer, rl.torch)
    limited_study(rl, timer, rl.torch)
    evaluations()
