"""Measure the prompts a search sends: their size per kind, and the share of each that a provider's prompt cache can
reuse (the prefix it shares with an earlier prompt of the same run and role).

    python tools/prompt_cache_share.py [--task examples/gqa_paged_decode_h32_kv4_d128_ps1 ...] [--iterations 30]
                                       [--json OUT.json]

It runs the real graph, the real LLM planner and coder with their prompts, and the real run store, with two stand-ins:
a scripted chat model (it answers with valid edit scripts and the task's seed code, slightly changed) and a synthetic
evaluator that reports GPU timings on an H100 (a few times each workload's speed-of-light floor; some attempts
and cycles fail to compile). So the prompts have the sizes and the structure of a real search's, and the measurement costs no
API call and no GPU. Tokens are estimated at 4 characters each.

A prompt's shared prefix is the longest prefix (system message and user message together, as the provider sees
them) it has in common with any earlier prompt of the same role in the run; the first prompt of each role has none
and is reported apart. "cacheable" applies OpenAI's rule on top: a prefix of at least 1024 tokens, counted in steps
of 128.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from langchain_core.language_models.chat_models import BaseChatModel  # noqa: E402
from langchain_core.messages import AIMessage  # noqa: E402
from langchain_core.outputs import ChatGeneration, ChatResult  # noqa: E402

from ksearch_graph.app.runs import drive, start  # noqa: E402
from ksearch_graph.config import (  # noqa: E402
    Budget,
    LLMSettings,  # noqa: E402
    SearchConfig,
)
from ksearch_graph.search.context import make_context  # noqa: E402
from ksearch_graph.search.roles.llm_roles import LLMCoder, LLMPlanner  # noqa: E402
from ksearch_graph.tasks.evaluation import EvalResult, Status, WorkloadResult, geometric_mean  # noqa: E402
from ksearch_graph.tasks.speed_of_light import SpeedOfLight, task_work  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PAPER_TASKS = ["gqa_paged_decode_h32_kv4_d128_ps1", "mla_paged_decode_h16_ckv512_kpe64_ps1",
               "mla_paged_prefill_causal_h16_ckv512_kpe64_ps1",
               "moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048", "trimul"]
GPU = "NVIDIA H100 80GB HBM3"
CHARS_PER_TOKEN = 4
CACHE_MIN_TOKENS, CACHE_STEP_TOKENS = 1024, 128  # OpenAI's prompt caching

ANALYSIS = (
    "Problem class: {name}. The math reduces to a few fused passes over the inputs; the workloads range from a "
    "handful of programs (latency-bound, the GPU is mostly idle) to thousands (bandwidth- or tensor-core-bound). "
    "Data layout: contiguous rows, scattered pages where the task says so; loads must be coalesced along the "
    "innermost dimension. Bottleneck hypotheses: small workloads are bound by launch latency and too few programs "
    "(split the long dimension and reduce in a second pass); large workloads by HBM bandwidth (read every byte "
    "once, keep partial results in registers) or by tensor-core throughput (bf16/fp8 dots, large tiles). Design "
    "space: tile sizes, programs per row, number of warps and stages, split factors, accumulation precision. "
    "Kernel skeleton: one program per tile, a loop over the reduction dimension with an online rescaling, a "
    "combine step when the reduction is split. Candidate families: a single fused kernel, a split kernel with a "
    "combine pass, a persistent kernel that balances ragged work."
)


class SyntheticEvaluator:
    """GPU-like results without a GPU, by attempt id cK.S (cycle K, step S): every third cycle fails throughout (a
    too-hard update follows), every other cycle's first attempt fails (debug prompts follow); a passing attempt
    runs each workload at a few times its floor, a little faster in later cycles and at step 2, flat after (the
    cycle stagnates). ``implausible``: that attempt runs at 0.8x the floor."""

    model = GPU

    def __init__(self, task, *, implausible: str | None = None):
        self.floors = SpeedOfLight(GPU, task_work(task)).floors()
        self.implausible = implausible

    def evaluate(self, task, files, *, attempt_id):
        match = re.fullmatch(r"c(\d+)[a-z]*\.(\d+)(?:\.\d+)?", attempt_id)
        cycle, step = (int(match.group(1)), int(match.group(2))) if match else (0, 0)
        if cycle % 3 == 2 or (cycle % 2 == 1 and step == 1):
            return EvalResult(status=Status.compile_error, log_excerpt=(
                f"kernel.py:{40 + step}: error: incompatible shapes for tl.dot: [16, 128] and [64, 128]\n"
                f"    acc += tl.dot(q, k)\n           ^\nCompilationError in {attempt_id}"))
        factor = 0.8 if attempt_id == self.implausible else 8.0 / (1 + 0.3 * cycle) * (0.9 if step >= 2 else 1.0)
        rows = []
        for w in task.feedback_workloads():
            floor = self.floors.get(w.name)
            if not w.timed or floor is None:
                continue
            us = floor.floor_us * factor
            ref, base = floor.floor_us * 40, floor.floor_us * 3
            rows.append(WorkloadResult(workload=w.name, correct=True, latency_us=us, reference_us=ref,
                                       speedup=ref / us, baseline_us=base, speedup_vs_baseline=base / us, runs=20))
        return EvalResult(status=Status.passed, workloads=rows, score=geometric_mean([r.speedup for r in rows]),
                          latency_us=geometric_mean([r.latency_us for r in rows]),
                          speedup_vs_baseline=geometric_mean([r.speedup_vs_baseline for r in rows]),
                          timing_representative=True, environment={"device": "cuda", "gpu": GPU})


class StandInLLM(BaseChatModel):
    """Valid answers for every prompt kind; usage reported like an OpenAI endpoint with prompt caching."""

    seed: str = ""
    name_: str = ""
    calls: int = 0
    earlier: dict[str, list[str]] = {}

    @property
    def _llm_type(self) -> str:
        return "stand-in"

    def _generate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        text = "".join(str(m.content) for m in messages)
        role = "planner" if "planner of K-Search" in str(messages[0].content) else "coder"
        answer = self._planner(str(messages[-1].content)) if role == "planner" else self._coder()
        shared = max((len(os.path.commonprefix([text, e])) for e in self.earlier.setdefault(role, [])), default=0)
        self.earlier[role].append(text)
        tokens = len(text) // CHARS_PER_TOKEN
        usage = {"input_tokens": tokens, "output_tokens": len(answer) // CHARS_PER_TOKEN,
                 "total_tokens": tokens + len(answer) // CHARS_PER_TOKEN,
                 "input_token_details": {"cache_read": cacheable(shared // CHARS_PER_TOKEN)}}
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=answer, usage_metadata=usage))])

    def _planner(self, prompt: str) -> str:
        self.calls += 1
        if "build the initial world model" in prompt:
            ops = [_insert("root", f"family {i}", 0.8 - 0.08 * i) for i in range(5)]
            return json.dumps({"analysis": ANALYSIS.format(name=self.name_), "reflection": None, "ops": ops})
        if "refill the frontier" in prompt:
            return json.dumps({"reflection": None, "ops": [_insert("root", f"refill {self.calls}.{i}", 0.7)
                                                            for i in range(2)]})
        node = re.search(r"# The cycle on node (n\d+)", prompt).group(1)
        reflection = {"current": "a fused kernel, bound by its loads on the small workloads",
                      "follow_through": "the code implements the action", "update_belief": "split the long axis next",
                      "perf_gap": "predicted 1.3x, observed less: launch latency dominates the small workloads"}
        if "was too hard as stated" in prompt:
            return json.dumps({"reflection": reflection, "ops": [{"op": "update", "node": node, "value": 0.2}]})
        return json.dumps({"reflection": reflection, "ops": [_insert(node, f"after {node} {i}", 0.5 - 0.05 * i)
                                                             for i in range(2)]})

    def _coder(self) -> str:
        self.calls += 1
        return f"Here is the kernel.\n```python\n# variant {self.calls}\n{self.seed}\n```\n"


def _insert(parent: str, title: str, value: float) -> dict:
    return {"op": "insert", "parent": parent, "action": {
        "title": title, "description": f"{title}: restructure the kernel's main loop so that every program handles a "
        "contiguous tile of the long axis, keep the partial results in registers and combine them in a second, small "
        "pass; tune the tile size to the workload.", "difficulty": 2, "value": round(value, 2),
        "predicted_gain": 1.3, "rationale": "the floors say the large workloads are far from the bandwidth limit"}}


def cacheable(tokens: int) -> int:
    """Tokens an OpenAI-style prompt cache serves for a shared prefix of ``tokens``."""
    return 0 if tokens < CACHE_MIN_TOKENS else tokens // CACHE_STEP_TOKENS * CACHE_STEP_TOKENS


def run_synthetic(task_dir: str | Path, run_dir: str | Path, *, iterations: int = 30, implausible: str | None = None,
                  samples: int = 1):
    """A search on ``task_dir`` with the stand-ins; returns its RunDir and SearchContext (store still open)."""
    from ksearch_graph.tasks.task import load_task

    task = load_task(task_dir)
    settings = LLMSettings(model="stand-in", structured_method="raw", price_prompt_per_mtok=1.25,
                           price_cached_prompt_per_mtok=0.125, price_completion_per_mtok=10.0)
    llm = StandInLLM(seed=task.seed_source or "", name_=task.name, earlier={})
    config = SearchConfig(budget=Budget(iterations=iterations), stagnation_window=3, planner="llm",
                          planner_llm=settings, coder_llm=settings, samples=samples)
    run = start(task_dir, run_dir, config)
    ctx = make_context(run, evaluator=SyntheticEvaluator(task, implausible=implausible),
                       planner=LLMPlanner(settings, llm), coder=LLMCoder(settings, llm))
    drive(run, ctx, fresh=True)
    return run, ctx


def prompt_kind(exchange: dict, text: str) -> str:
    if exchange["role"] == "coder":
        return exchange["purpose"]
    if exchange["purpose"] == "update" and "was too hard as stated" in text:
        return "too_hard"
    return exchange["purpose"]


def measure(store) -> dict[str, Any]:
    """Per prompt kind: calls, tokens and shared-prefix shares of every request the run recorded. ``shared``: the
    prefix shared with an earlier call of the role (what a cache can serve); ``stable``: with any other call of the
    role, earlier or later (the prefix that stays the same across the run's calls: a run's first update is the
    first prompt with the analysis in it, so a cache serves it less than its stable prefix)."""
    calls = [(exchange, "".join(m["content"] for m in call["messages"]))
             for exchange in store.exchanges() for call in exchange["transcript"]]
    rows = []
    for i, (exchange, text) in enumerate(calls):
        same_role = [(j, other) for j, (e, other) in enumerate(calls) if j != i and e["role"] == exchange["role"]]
        shared = max((len(os.path.commonprefix([text, other])) for j, other in same_role if j < i), default=None)
        stable = max((len(os.path.commonprefix([text, other])) for _, other in same_role), default=0)
        rows.append({"kind": prompt_kind(exchange, text), "tokens": len(text) / CHARS_PER_TOKEN,
                     "shared": None if shared is None else shared / len(text), "stable": stable / len(text),
                     "cacheable": None if shared is None else
                     cacheable(shared // CHARS_PER_TOKEN) / (len(text) / CHARS_PER_TOKEN)})
    kinds = {}
    for kind in dict.fromkeys(r["kind"] for r in rows):
        mine = [r for r in rows if r["kind"] == kind]
        later = [r for r in mine if r["shared"] is not None]
        kinds[kind] = {
            "calls": len(mine), "tokens_median": statistics.median(r["tokens"] for r in mine),
            "tokens_max": max(r["tokens"] for r in mine),
            "shared_median": statistics.median(r["shared"] for r in later) if later else None,
            "shared_min": min(r["shared"] for r in later) if later else None,
            "cacheable_median": statistics.median(r["cacheable"] for r in later) if later else None,
            "stable_min": min(r["stable"] for r in mine),
            "first_calls": len(mine) - len(later)}
    later = [r for r in rows if r["shared"] is not None]
    total = sum(r["tokens"] for r in later)
    return {"kinds": kinds, "shared_overall": sum(r["shared"] * r["tokens"] for r in later) / total,
            "cacheable_overall": sum(r["cacheable"] * r["tokens"] for r in later) / total,
            "calls_at_least_70": sum(r["shared"] >= 0.7 for r in later) / len(later),
            "stable_at_least_70": sum(r["stable"] >= 0.7 for r in rows) / len(rows)}


def _pct(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.0f}%"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", action="append", help="task folder (default: the paper's five example tasks)")
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    tasks = args.task or [str(REPO / "examples" / name) for name in PAPER_TASKS]
    results = {}
    for task_dir in tasks:
        with tempfile.TemporaryDirectory() as tmp:
            run, ctx = run_synthetic(task_dir, Path(tmp) / "run", iterations=args.iterations)
            results[Path(task_dir).name] = figures = measure(ctx.store)
            ctx.store.close()
        print(f"\n{Path(task_dir).name}: {_pct(figures['shared_overall'])} of the prompt tokens after each role's "
              f"first call are in a prefix shared with an earlier call ({_pct(figures['cacheable_overall'])} "
              f"cacheable by OpenAI's rule); {_pct(figures['calls_at_least_70'])} of those calls share >= 70%; "
              f"{_pct(figures['stable_at_least_70'])} of all calls have a stable prefix of >= 70%")
        print("| prompt kind | calls | tokens (median / max) | shared prefix (median / min) | cacheable (median) "
              "| stable prefix (min) |")
        print("|---|---|---|---|---|---|")
        for kind, k in figures["kinds"].items():
            first = f" (+{k['first_calls']} first)" if k["first_calls"] else ""
            print(f"| {kind} | {k['calls'] - k['first_calls']}{first} | {k['tokens_median']:.0f} / "
                  f"{k['tokens_max']:.0f} | {_pct(k['shared_median'])} / {_pct(k['shared_min'])} | "
                  f"{_pct(k['cacheable_median'])} | {_pct(k['stable_min'])} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
