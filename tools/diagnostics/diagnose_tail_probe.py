"""The side-stream rule's two figures per timed call, tail and probe, for an honest small kernel in fresh processes.

    python tools/diagnostics/diagnose_tail_probe.py [PROCESSES]      # on the GPU host, from the repository root (~20 s)

The judge reads tail - probe as work left on another stream (harness/timing.py, SideStreamRule, says how, per burst).
Question: how far do an honest kernel's tail and probe read apart in fresh processes (what the rule's slack must
absorb; figures in docs/timing.md)? Each process here does what the candidate's process does for
that workload: a heat, then timed calls on fresh inputs (``timing.timed_burst``), and prints every call's device time,
tail and probe.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def one_process() -> None:
    from ksearch_graph.harness import _torch, timer, timing

    torch = _torch.load_torch()
    timer = timer.Timer("cuda")
    g = torch.Generator(device="cuda").manual_seed(3)

    def call(k=0):
        x = torch.randn(16, 4096, device="cuda", generator=g)
        w = torch.randn(4096, 2048, device="cuda", generator=g)
        return (lambda a, b: torch.relu(a @ b)), (x, w)

    fn, args = call()
    fn(*args)
    timer.heat(fn, args, first=True)
    done = timing.timed_burst(timer, 20, call, filler=(fn, args))
    extra = [tail - probe for _, _, tail, probe, _ in done]
    call_us = statistics.median(d[1] for d in done)
    print(f"  host spin-waits {timer.runtime.spin_wait}; limited {timer.limited}; median call {call_us:.1f} us, "
          f"median tail - probe {statistics.median(extra):.1f} us (slack {max(10.0, 0.2 * call_us):.1f})")
    print("  us / tail / probe: " + ", ".join(f"{us:.0f}/{tail:.0f}/{probe:.0f}" for _, us, tail, probe, _ in done))


def main() -> None:
    if sys.argv[1:2] == ["--one"]:
        one_process()
        return
    for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
        print(f"process {i + 1}:", flush=True)
        subprocess.run([sys.executable, __file__, "--one"], check=False)


if __name__ == "__main__":
    main()
