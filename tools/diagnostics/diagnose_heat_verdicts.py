"""Which rule made the heat call a workload power-limited, window by window.

    python tools/diagnostics/diagnose_heat_verdicts.py      # on the GPU host, from the repository root (~40 s)

Session 10's H200 called a 64K-element multiply (358 W of 700) and the softmax example power-limited, and the 3072^3
bf16 matmul in all three calibration evaluations (one H200: not limited). This runs each workload's first
heat REPEATS times, light and heavy interleaved as an evaluation meets them, and prints the verdict (``limited_by``:
"power", "slowdown", "clock", "no power reading", "no NVML"; None: not limited) with each heat window's mean
call time, whether NVML read the clock held, and the instantaneous power, and the most the calls slowed down (the
LOAD_SLOWDOWN rule, which counts only near the cap: SLOWDOWN_POWER). A fresh process's first heat starts from a
possibly cool GPU, as a judge's does.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

REPEATS = 4


def slowdown(trace) -> float:
    """The largest slowdown the LOAD_SLOWDOWN rule saw: a window against the fastest after the first, up to it."""
    us = [t[0] for t in trace]
    return max([us[k] / min(us[1:k + 1]) - 1 for k in range(2, len(us))], default=0.0)


def main() -> None:
    from ksearch_graph.harness import _torch, policy, timer

    _torch.load_torch()
    import torch

    timer = timer.Timer("cuda")
    gauge = timer.gauge
    print(f"{torch.cuda.get_device_name()}, top SM clock {gauge.top} MHz, enforced limit {gauge.limit_mw / 1e3:.0f} W,"
          f" power field {gauge.has_power}; POWER_LIMITED {policy.POLICY.power_limited}, LOAD_SLOWDOWN {policy.POLICY.load_slowdown}, "
          f"SLOWDOWN_POWER {policy.POLICY.slowdown_power}")
    g = torch.Generator(device="cuda").manual_seed(1)

    def mm(n):
        return torch.matmul, tuple(torch.randn(n, n, generator=g, device="cuda", dtype=torch.bfloat16)
                                   for _ in range(2))

    workloads = {
        "mul-64K": (lambda x: x * 2, (torch.ones(1 << 16, device="cuda"),)),
        "softmax-16x300": (lambda x: torch.softmax(x, -1), (torch.randn(16, 300, device="cuda"),)),
        "mm-bf16-3072": mm(3072),
        "scale-fp32-64M": (torch.mul, (torch.randn(1 << 26, generator=g, device="cuda"), 1.5)),
        "mm-bf16-4096": mm(4096),
        "mm-bf16-8192": mm(8192),
    }
    print("| round | workload | limited_by | heat ms | most slowdown (whatever the power) "
          "| windows: call us / clock held / W |")
    print("| --- | --- | --- | --- | --- | --- |")
    for round_ in range(REPEATS):
        for name, (fn, args) in workloads.items():
            fn(*args)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            timer.heat(fn, args, first=True)
            ms = (time.perf_counter() - t0) * 1e3
            trace = " ; ".join(f"{us:.1f}/{'H' if held else '-'}/{'-' if w is None else f'{w:.0f}'}"
                               for us, held, w in timer.heat_trace)
            print(f"| {round_} | {name} | {timer.limited_by} | {ms:.0f} | {100 * slowdown(timer.heat_trace):.1f}% | "
                  f"{trace} |", flush=True)
        time.sleep(0.5)


if __name__ == "__main__":
    main()
