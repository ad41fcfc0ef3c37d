"""Check the speed-of-light floors against a hand calculation, and the fraction of the floor the example seeds reach.

    python tools/sol_check.py [--json OUT.json] [--gpu NAME] [--no-evaluate]

For the GQA paged decode and TriMul examples, every timed workload's bytes and flops are worked out here by hand,
from the shapes and dtypes the specs state (not by the tasks' own speed_of_light() or the flop counter ksearch uses),
with the GPU's peaks spelled out, and printed next to ksearch's floors; they must agree. On a CUDA host each task's
seed is then evaluated by the harness on every workload and the fraction of the floor it reaches is printed next to
the same fraction computed by hand (floor / measured latency).

Without a GPU (degraded mode) nothing is measured: the floors are checked for ``--gpu`` (default an H100 SXM). Exit
status 1 if a hand figure and ksearch's differ.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ksearch_graph.harness.modules import load_module  # noqa: E402
from ksearch_graph.tasks.gpu_specs import gpu_spec  # noqa: E402
from ksearch_graph.tasks.speed_of_light import SpeedOfLight, fractions, task_work  # noqa: E402
from ksearch_graph.tasks.task import load_task  # noqa: E402

GQA = ROOT / "examples" / "gqa_paged_decode_h32_kv4_d128_ps1"
TRIMUL = ROOT / "examples" / "trimul"
BF16, FP32, INT32 = 2, 4, 4  # bytes per element


def gqa_by_hand(params: dict, lengths) -> tuple[int, int, str]:
    """GQA decode, 32 query heads over 4 KV heads of 128, page size 1 (spec.md, "Inputs" and "Math")."""
    lens = lengths(params)
    b, total = len(lens), sum(lens)
    kv_rows = total * 4 * 128 * BF16 * 2  # the K and V rows of every page a sequence owns (the pool's rest unread)
    q_and_out = b * 32 * 128 * BF16 * 2  # q read, output written
    lse = b * 32 * FP32
    page_table = total * INT32 + (b + 1) * INT32  # kv_indices, kv_indptr
    flops = total * 32 * (2 * 128 + 2 * 128)  # per token and query head: q.k (128 MACs) and p.v (128 MACs)
    return kv_rows + q_and_out + lse + page_table, flops, "bf16"


def trimul_by_hand(params: dict, _lengths=None) -> tuple[int, int, str]:
    """TriMul (spec.md, "Inputs" and "Math"): x, mask, weights read and y written in fp32; five H x D projections and
    the D x H output projection per pair, and the N^3 contraction per hidden channel."""
    n, b, d, h = (int(params[k]) for k in ("N", "B", "D", "H"))
    pairs = b * n * n
    bytes_ = pairs * d * FP32 + pairs * FP32 + (5 * h * d + d * h + 2 * d + 2 * h) * FP32 + pairs * d * FP32
    flops = pairs * (5 * 2 * h * d + 2 * h * d) + b * 2 * h * n ** 3
    return bytes_, flops, "fp16"  # the 2e-2 tolerance leaves room for 16-bit tensor cores


def check(task_dir: Path, by_hand, gpu_name: str, evaluator) -> tuple[list[dict], bool]:
    task = load_task(task_dir)
    spec = gpu_spec(gpu_name)
    sol = SpeedOfLight(gpu_name, task_work(task))
    floors = sol.floors()
    lengths = getattr(load_module(f"sol_check_{task.name}", str(task.path(task.spec.reference))), "kv_lengths", None)
    result = None
    if evaluator is not None:
        result = evaluator.evaluate(task, {task.spec.solution_file: task.seed_source}, attempt_id="sol-check")
    measured = {w.workload: w.latency_us for w in (result.workloads if result else []) if w.timed}
    ours = fractions(result, sol.work) if result is not None else None
    rows, agree = [], True
    print(f"\n== {task.name}: seed {task.spec.seed_solution} on {gpu_name} = {spec.name}")
    print(f"   peaks ({spec.source}): memory {spec.bandwidth:.4g} B/s; 16-bit tensor {spec.peak_flops('fp16'):.4g} "
          f"flop/s; FP32 {spec.peak_flops('fp32'):.4g} flop/s")
    if result is not None:
        print(f"   evaluation: {result.status.value}" + (f", {result.log_excerpt.splitlines()[0]}"
                                                        if result.log_excerpt and not result.passed else ""))
    print(f"   {'workload':34s} {'bytes':>14s} {'flops':>17s} {'mem us':>9s} {'comp us':>9s} {'floor us':>9s} "
          f"{'ksearch':>9s} {'latency':>9s} {'by hand':>8s} {'ksearch':>8s}")
    for w in task.spec.workloads:
        if not w.timed:
            continue
        nbytes, flops, compute = by_hand(w.params, lengths)
        memory_us = nbytes / spec.bandwidth * 1e6
        compute_us = flops / spec.peak_flops(compute) * 1e6
        floor_us = max(memory_us, compute_us)
        library = floors[w.name]
        same = (library.work.bytes, library.work.flops) == (nbytes, flops) and \
            abs(library.floor_us - floor_us) <= 1e-9 * floor_us
        agree &= same
        latency = measured.get(w.name)
        hand_fraction = floor_us / latency if latency else None
        our_fraction = ours.per_workload.get(w.name) if ours else None
        rows.append({"task": task.name, "workload": w.name, "bytes": nbytes, "flops": flops, "compute": compute,
                     "memory_us": memory_us, "compute_us": compute_us, "floor_us": floor_us,
                     "ksearch_floor_us": library.floor_us, "agree": same, "latency_us": latency,
                     "fraction_by_hand": hand_fraction, "fraction_ksearch": our_fraction})
        print(f"   {w.name:34s} {nbytes:>14,d} {flops:>17,d} {memory_us:9.3f} {compute_us:9.3f} {floor_us:9.3f} "
              f"{library.floor_us:9.3f} {_f(latency, '9.3f')} {_pct(hand_fraction)} {_pct(our_fraction)}"
              + ("" if same else "   <- DIFFERS"))
    if ours is not None:
        print(f"   geometric mean: {_pct(ours.fraction).strip()} of the floor"
              + (f"; IMPLAUSIBLE on {', '.join(ours.implausible)}" if ours.implausible else ""))
    return rows, agree


def _f(value, spec: str) -> str:
    return format(value, spec) if value is not None else f"{'-':>{spec.split('.')[0]}}"


def _pct(value) -> str:
    return f"{100 * value:7.2f}%" if value is not None else f"{'-':>8s}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", help="the GPU whose peaks to use without one (default: the CUDA device, else an H100 SXM)")
    ap.add_argument("--no-evaluate", action="store_true", help="check the floors only, even on a CUDA host")
    ap.add_argument("--json", help="write every row here")
    args = ap.parse_args()
    import torch

    cuda = torch.cuda.is_available()
    gpu_name = args.gpu or (torch.cuda.get_device_name() if cuda else "NVIDIA H100 80GB HBM3")
    if gpu_spec(gpu_name) is None:
        print(f"{gpu_name} is not in ksearch_graph/tasks/gpu_specs.py's table: no floor to check", file=sys.stderr)
        return 2
    evaluator = None
    if cuda and not args.no_evaluate:
        from ksearch_graph.harness.parent.client import SubprocessEvaluator

        evaluator = SubprocessEvaluator(workloads="all", timeout_s=900, time_budget_s=1.0)
    else:
        print("no GPU (or --no-evaluate): degraded mode, the floors are checked but nothing is measured")
    rows, agree = [], True
    try:
        for task_dir, by_hand in ((GQA, gqa_by_hand), (TRIMUL, trimul_by_hand)):
            task_rows, task_agree = check(task_dir, by_hand, gpu_name, evaluator)
            rows += task_rows
            agree &= task_agree
    finally:
        getattr(evaluator, "close", lambda: None)()
    if args.json:
        Path(args.json).write_text(json.dumps({"gpu": gpu_name, "agree": agree, "rows": rows}, indent=2))
    print("\nhand calculation and ksearch agree on every floor" if agree else "\nFLOORS DIFFER (see above)")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
