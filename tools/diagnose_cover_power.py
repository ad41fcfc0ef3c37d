"""Whether the launch cover's hold lets a power-limited kernel's clock recover before its timed call.

    python tools/diagnose_cover_power.py      # on the GPU host, from the repository root (~40 s)

Sessions 9-10: the harness read the power-limited 4096^3 bf16 matmul 5-7% faster than ``triton.testing.do_bench``
(whatever the fillers), while within 2.7% of CUDA-graph replay. The cover holds every SM for COVER_S (0.5 ms, spinning
on the global timer, which draws little power) right before each timed call: 2.8x a 180 us call. This times 20
calls (2 ms host gap each, fillers as the runner's) behind covers of several holds, and do_bench, per matmul, and
prints NVML's power after each burst.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HOLDS_S = (0.5e-3, 0.25e-3, 0.1e-3)
GAP_S = 2e-3


def main() -> None:
    from ksearch_graph import _candidate_runner as rl

    rl.load_torch()
    import torch
    import triton.testing

    timer = rl.Timer("cuda")
    cover = rl.load_module("_ksearch_launch_cover", str(ROOT / "ksearch_graph" / "_launch_cover.py"))
    g = torch.Generator(device="cuda").manual_seed(1)

    def mm(n):
        return torch.matmul, tuple(torch.randn(n, n, generator=g, device="cuda", dtype=torch.bfloat16)
                                   for _ in range(2))

    print(f"{torch.cuda.get_device_name()}; FILL_DUTY {rl.FILL_DUTY}, FILL_MAX {rl.FILL_MAX}, gap {GAP_S * 1e3:g} ms")
    print("| workload | do_bench us | cover hold us | median us | diff | limited_by | W after |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for n in (4096, 8192):
        fn, args = mm(n)
        time.sleep(0.5)
        bench_us = triton.testing.do_bench(lambda: fn(*args), warmup=50, rep=300, return_mode="mean") * 1e3

        def next_call(k, n=n):
            time.sleep(GAP_S)
            return mm(n)

        for hold in HOLDS_S:
            timer.cover = cover.LaunchCover(timer.flush, hold)
            time.sleep(0.3)
            timer.heat(fn, args, first=True)
            done = rl.timed_burst(timer, 20, next_call, filler=(fn, args))
            us = sorted(d[1] for d in done)
            median = us[len(us) // 2]
            watts = timer.gauge.power()
            print(f"| mm-bf16-{n} | {bench_us:.1f} | {hold * 1e6:.0f} | {median:.1f} | "
                  f"{100 * (median - bench_us) / bench_us:+.2f}% | {timer.limited_by} | {watts:.0f} |", flush=True)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
