"""Why small kernels read slow after the host waited, and what covers it.

    python tools/diagnostics/diagnose_small_kernel_timing.py      # on the GPU host, from the repository root (~1 min)

Session 6 found the cheat task's skinny workload (relu(x @ w), 16x4096 @ 4096x2048 fp32: 31 us back to back) read
105-212 us in timed calls after its inputs were made on the CPU (~50 ms); the cause: the host then takes
130-230 us to launch the call, and the device idles between the start event and the call's kernels (BENCHMARKS.md).
This prints:

1. per kernel, the timed call's median / max device time, the host's median time to launch the call, and the SM
   clock before it, after an idle of 0-50 ms (the host asleep), with one of: nothing but the 256 MB flush (``zero_``,
   as without a cover), the launch cover (``Timer.cover``: every SM held 0.5 ms, then the flush), or 1 ms of the
   kernel's own calls first (``Timer.back_to_back``, which warms the host's launch path);
2. whole evaluations of the cheat task's honest candidate through SubprocessEvaluator.

    python tools/diagnostics/diagnose_small_kernel_timing.py --means   # (~2 min)

Session 11 saw the honest skinny workload read median 31.8-32.5 us in every evaluation of the cheat suite but mean
31.9-46.0 us (one or two slow calls among 10; scores use means). This prints:

1. whole evaluations at the cheat suite's 0.5 s timing budget and the default 1 s, each with the slow calls (over
   1.2x the median) of the reference and the candidate from the judge's trace (KSEARCH_TIMING_TRACE);
2. the candidate's side of a burst in this process (``timed_burst``, each call's seed asked over a pipe of another
   process as from the judge, its inputs made on the CPU as the task does), 60 calls per variant: as evaluated,
   Python's garbage collector on in the timed calls (as without the rule), the inputs made ahead (no host work or
   pipe wait before the call), made on one CPU thread, 1 ms of host spin after them, a 1 or 2 ms launch cover. Per
   variant: median / mean / max, the escape check's tail - probe, and the slow calls with their tail, probe and
   host time: which of these the slow calls need says where they come from.

Power-limited kernels (the heat's verdict): diagnose_heat_verdicts.py.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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
            out = fn(*args)  # noqa: B023 (the wrapper is used within its pass)
            launch.append(  # noqa: B023
                (time.perf_counter() - t0) * 1e6)
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


def evaluations(budgets=(0.5,), count: int = 2) -> None:
    from ksearch_graph.harness.judge.session import TRACE_ENV
    from ksearch_graph.harness.parent.client import SubprocessEvaluator
    from ksearch_graph.tasks.task import load_task

    folder = Path(tempfile.mkdtemp()) / "task"
    shutil.copytree(ROOT / "tests" / "cheats" / "task", folder)
    spec = json.loads((folder / "task.json").read_text())
    spec["workloads"] = [{"name": "square", "params": {"m": 2048, "k": 2048, "n": 2048}},
                         {"name": "skinny", "params": {"m": 16, "k": 4096, "n": 2048}}]
    (folder / "task.json").write_text(json.dumps(spec))
    task = load_task(folder)
    honest = {"kernel.py": (ROOT / "tests" / "cheats" / "honest.py").read_text()}
    trace = folder.parent / "trace.jsonl"
    os.environ[TRACE_ENV] = str(trace)  # every timed call, from the judge
    for budget_s in budgets:
        # Reference timings are not reused: each evaluation times the reference as well.
        ev = SubprocessEvaluator(timeout_s=300, time_budget_s=budget_s, workloads="all", prestart=False,
                                 reuse_reference_timings_s=0)
        for i in range(count):
            trace.write_text("")
            r = ev.evaluate(task, honest, attempt_id=f"honest{i}")
            cells = [f"{w.workload}: median {w.median_us or 0:.1f} us, mean {w.latency_us or 0:.1f} us, std "
                     f"{w.std_us or 0:.1f} us, reference {w.reference_us or 0:.1f} us, runs {w.runs}"
                     for w in r.workloads]
            print(f"budget {budget_s} s, evaluation {i + 1}: {r.status.value}; " + "; ".join(cells)
                  + f"; {r.log_excerpt[:200]!r}", flush=True)
            print_slow_calls([json.loads(line) for line in trace.read_text().splitlines()])
    del os.environ[TRACE_ENV]


def print_slow_calls(bursts: list[dict]) -> None:
    """Per side and workload, the calls over 1.2x the median: (index: device, tail, probe, host us)."""
    calls = {}
    for b in bursts:
        calls.setdefault((b["who"], b["workload"]), []).extend(b["calls"])
    for (who, workload), done in calls.items():
        median = statistics.median(c[0] for c in done)
        slow = [f"{k}: {us:.0f}, {tail:.0f}, {probe:.0f}, {host:.0f}" for k, (us, tail, probe, host) in enumerate(done)
                if us > 1.2 * median]
        print(f"    {who} {workload}: {len(done)} calls, median {median:.1f} us, slow: {'; '.join(slow) or '-'}")


def burst_study(timer, calls: int = 60) -> None:
    """The candidate's side of a burst of the skinny workload, in this process (see the module's docstring)."""
    import gc
    import subprocess

    make_inputs = tasks.load_module("cheat_task_reference", str(ROOT / "tests" / "cheats" / "task" / "reference.py")
                                 ).make_inputs
    params = {"m": 16, "k": 4096, "n": 2048}
    fn = lambda x, w: _torch.load_torch().relu(x @ w)  # noqa: E731  (tests/cheats/honest.py)
    # The judge's side of the seed round trip: another process that answers each line, as the judge does.
    echo = subprocess.Popen([sys.executable, "-u", "-c", "import sys\nfor line in sys.stdin: print(line, end='')"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
    plain_cover = timer.cover
    ahead = [make_inputs(params, 1000 + k, "cuda") for k in range(calls)]
    torch = _torch.load_torch()
    threads = torch.get_num_threads()

    def asked(k: int) -> tuple:
        echo.stdin.write(f"{k}\n")
        return make_inputs(params, int(echo.stdout.readline()), "cuda")

    def one_thread(k: int) -> tuple:
        torch.set_num_threads(1)
        try:
            return asked(k)
        finally:
            torch.set_num_threads(threads)

    def host_spun(k: int) -> tuple:
        inputs = asked(k)
        timer.sync()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 1e-3:
            pass
        return inputs

    # (label, inputs of call k, the cover's hold or None for the harness's own cover)
    variants = [("as evaluated", asked, None), ("collector on (as without the rule)", asked, None),
                ("inputs made ahead", lambda k: ahead[k], None),
                (f"inputs on 1 CPU thread (not {threads})", one_thread, None), ("1 ms host spin after inputs",
                host_spun, None), ("cover 1 ms", asked, 1e-3), ("cover 2 ms", asked, 2e-3)]
    print(f"{calls} calls each; tail - probe: the escape check's figure (median; calls over 10 us)")
    print("| variant | median us | mean us | max us | tail - probe | slow calls (k: us, tail, probe, host us) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label, make, hold_s in variants:
        timer.cover = _cover(timer, hold_s) if hold_s else plain_cover
        heat = make_inputs(params, 7, "cuda")
        timer.heat(fn, heat, first=True)
        if label.startswith("collector on"):
            timer.gc_disable = lambda: None
        try:
            done = timing.timed_burst(timer, calls, lambda k: (fn, make(k)))  # noqa: B023 (used within its pass)
        finally:
            timer.gc_disable = gc.disable
        us = [d[1] for d in done]
        median = statistics.median(us)
        escaped = [tail - probe for _, _, tail, probe, _ in done]
        slow = [f"{k}: {t:.0f}, {tail:.0f}, {probe:.0f}, {host:.0f}" for k, (_, t, tail, probe, host) in enumerate(done)
                if t > 1.2 * median]
        print(f"| {label} | {median:.1f} | {statistics.fmean(us):.1f} | {max(us):.0f} | "
              f"{statistics.median(escaped):.1f} ({sum(e > 10 for e in escaped)}) | {'; '.join(slow) or '-'} |",
              flush=True)
    timer.cover = plain_cover
    echo.stdin.close()
    echo.wait()


def _cover(timer, hold_s: float):
    from ksearch_graph.harness import launch_cover

    return launch_cover.LaunchCover(timer.flush, hold_s)


if __name__ == "__main__":
    from ksearch_graph.harness import _torch, tasks, timer, timing

    _torch.load_torch()
    timer = timer.Timer("cuda")
    print(f"launch cover: {timer.cover_kind}")
    timer.launch_cover = timer.cover
    if "--means" in sys.argv[1:]:
        evaluations(budgets=(0.5, 1.0), count=3)
        burst_study(timer)
    else:
        idle_study(timer, _torch.load_torch())
        evaluations()
