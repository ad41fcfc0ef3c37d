"""Search throughput on an evaluation pool: iterations per hour and pool utilisation against the serial loop.

    python tools/bench_throughput.py [--pool local|ray|both] [--workers 1,2,4,8] [-k 1,2,4,8,16]
        [--llm-s 30 --llm-jitter-s 10] [--eval-s 15 --eval-jitter-s 5] [--scale 0.05] [--iterations-per-lane 4]
        [--samples 1] [--extra W:KxS[:BUDGET],...] [--evaluator standin|real] [--out results.json]

Everything is real except the LLM and (by default) the GPU: the graph, the checkpointer, the run store, the pool's
leasing (local slots, or Ray tasks holding one logical GPU each on a local Ray with ``--workers`` GPUs), and the
LLM client talking HTTP to a local OpenAI-compatible stand-in server that answers every prompt with a valid planner
edit (as many new ideas as an edit may add, under the node the cycle worked on) or a template instance of the softmax task, after a drawn latency
(``--llm-s`` +- ``--llm-jitter-s``, uniform). The stand-in evaluation holds its slot for a drawn time (``--eval-s`` +-
``--eval-jitter-s``) and scores the candidate from its template parameters; ``--evaluator real`` runs the harness
(Triton interpreter on CPU) instead, local pool only.

All times are multiplied by ``--scale`` so a grid runs in minutes on a small machine; iterations per hour are
reported at full scale (measured rate x 1 / scale). The graph's own time is not scaled: it is reported as the
serial run's wall time not spent in the LLM or the evaluator, per iteration, and as the driver's CPU time per
iteration in every run.

Pool busy = slot-time leased to evaluations / (slots x window), in two windows: "run" is the whole search (start-up
included: the seed's measurement, the world model's initialisation and the first code generation, during which the
pool is mostly idle, and the final update); "steady" runs from the first search evaluation's start to the last
evaluation's end (start-up and the final update excluded; the ramp-up of lanes and the drain at the end included).
Iterations per hour are over the whole run. On Ray a slot counts as leased while the evaluation runs on the worker;
Ray's own dispatch time per task (measured as the round trip of a no-op task holding one GPU, before each block) is
reported separately, since it is not scaled down with the evaluation.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fake_openai_server import FakeOpenAIServer, Reply  # noqa: E402

from ksearch_graph.app.runs import drive, start  # noqa: E402
from ksearch_graph.config import (  # noqa: E402
    Budget,
    LLMSettings,  # noqa: E402
    SearchConfig,
)
from ksearch_graph.harness.parent.client import SubprocessEvaluator  # noqa: E402
from ksearch_graph.harness.parent.pool import EvaluationPool, Slot  # noqa: E402
from ksearch_graph.search.context import make_context  # noqa: E402
from ksearch_graph.search.roles.offline import params_of  # noqa: E402
from ksearch_graph.search.roles.template import render_template  # noqa: E402
from ksearch_graph.search.world_model import MAX_INIT_NODES, MAX_NEW_NODES  # noqa: E402
from ksearch_graph.tasks.evaluation import EvalResult, Status  # noqa: E402
from ksearch_graph.tasks.task import load_task  # noqa: E402

TASK = Path(__file__).resolve().parent.parent / "examples" / "softmax"


class StandInLLM(FakeOpenAIServer):
    """Answers any prompt after a drawn latency: the planner with as many new ideas as allowed (under the cycle's
    node), the coder with a random template instance."""

    def __init__(self, task, latency_s: float, jitter_s: float, seed: int = 0):
        super().__init__()
        self.task, self.latency_s, self.jitter_s = task, latency_s, jitter_s
        self.rng = random.Random(seed)
        self.ideas = 0
        self.latency_total = 0.0  # the latency it added, summed over its answers

    def start(self) -> StandInLLM:
        super().start()
        # Headers and body go out as two writes: without TCP_NODELAY each answer waits ~40 ms for a delayed ACK.
        self._httpd.RequestHandlerClass.disable_nagle_algorithm = True
        return self

    def _next(self, body: dict) -> Reply:
        with self._lock:
            self.requests.append({})
            delay = max(0.0, self.rng.uniform(self.latency_s - self.jitter_s, self.latency_s + self.jitter_s))
            self.latency_total += delay
            if "planner of K-Search" in str(body["messages"][0].get("content")):
                prompt = str(body["messages"][-1].get("content"))
                init = "build the initial world model" in prompt.lower()
                node = re.search(r"# The cycle on node (\S+):", prompt)
                parent = node.group(1) if node else "root"  # a solved node needs an open continuation
                ops = []
                for _ in range(MAX_INIT_NODES if init else MAX_NEW_NODES):
                    self.ideas += 1
                    ops.append({"op": "insert", "parent": parent, "action": {
                        "title": f"idea {self.ideas}", "description": f"Try idea {self.ideas}.", "difficulty": 2,
                        "value": round(self.rng.uniform(0.3, 0.9), 3), "predicted_gain": 1.1, "rationale": "bench",
                        "params": {}}})
                reflection = {"current": "c", "follow_through": "yes", "update_belief": "u", "perf_gap": "p"}
                return Reply.json({"analysis": "", "reflection": None if init else reflection, "ops": ops},
                                  delay_s=delay)
            spec = self.task.spec.template.parameters
            params = {name: self.rng.choice(p.values) for name, p in spec.items()}
            params["VARIANT"] = self.rng.choice(["online", "two_pass"])
            source = render_template(self.task, params)[self.task.spec.solution_file]
            return Reply.content(f"```python\n{source}\n```", delay_s=delay)


def standin_score(files: dict[str, str]) -> float:
    p = params_of(files)
    return p.get("BLOCK_N", 256) / 256 * p.get("ROWS_PER_PROGRAM", 1) ** 0.5 / (1 + abs(p.get("NUM_WARPS", 4) - 4) / 8)


class StandInEvaluator:
    """Holds its slot for a drawn time, like a GPU evaluation of that length, and scores from the parameters."""

    def __init__(self, mean_s: float, jitter_s: float, seed: int):
        self.mean_s, self.jitter_s, self.rng = mean_s, jitter_s, random.Random(seed)

    def evaluate(self, task, files, *, attempt_id):
        time.sleep(max(0.0, self.rng.uniform(self.mean_s - self.jitter_s, self.mean_s + self.jitter_s)))
        score = standin_score(files)
        return EvalResult(status=Status.passed, score=score, latency_us=100 / score)


def pause(seconds: float) -> None:
    time.sleep(seconds)


def ray_standin(bundle: bytes, digest: str, files: dict[str, str], attempt_id: str, settings: dict,
                job: str) -> tuple[str, float, float]:
    """On a Ray worker holding one logical GPU, in place of the harness (``evaluate_on_worker``'s signature): the
    product's task unpacking, then the stand-in evaluation for a time drawn from the attempt's id."""
    from ksearch_graph.harness.parent import ray_shipping

    start = time.time()
    ray_shipping.unpack_task(bundle, digest, job)
    rng = random.Random(f"{settings['seed']}:{attempt_id}")
    mean, jitter = settings["mean_s"], settings["jitter_s"]
    time.sleep(max(0.0, rng.uniform(mean - jitter, mean + jitter)))
    score = standin_score(files)
    result = EvalResult(status=Status.passed, score=score, latency_us=100 / score)
    return result.model_dump_json(), start, time.time()


def ray_standin_pool(gpus: int, mean_s: float, jitter_s: float, seed: int):
    """The product's Ray pool (its slots, retries, task shipping and accounting) with the stand-in evaluation on the
    workers: each evaluation a task holding one logical GPU and no CPU (the stand-in only sleeps, and the local Ray
    has 2 CPUs)."""
    import ray

    from ksearch_graph.harness.parent.ray_pool import RayPool

    class RayStandInPool(RayPool):
        def _remote_fn(self):
            if self._remote is None:
                self._remote = ray.remote(max_retries=0, max_calls=0)(ray_standin)  # as RayPool's
            return self._remote

    return RayStandInPool({"num_gpus": 1, "num_cpus": 0}, {"mean_s": mean_s, "jitter_s": jitter_s, "seed": seed},
                          gpus, "standin")


def ray_dispatch_ms(samples: int = 20) -> float:
    """Median round trip of a no-op Ray task holding one logical GPU: Ray's own cost per evaluation on this host."""
    import statistics

    import ray

    noop = ray.remote(num_gpus=1, num_cpus=0, max_calls=0)(pause)
    times = []
    for _ in range(samples):
        t = time.perf_counter()
        ray.get(noop.remote(0.0))
        times.append(time.perf_counter() - t)
    return round(1000 * statistics.median(times), 1)


def utilisation(intervals, slots: int, since: float, until: float) -> float:
    from ksearch_graph.harness.parent.pool import busy_share

    return busy_share(intervals, slots, since, until)


def run_one(args, pool_kind: str, workers: int, k: int, samples: int, budget: int | None, server: StandInLLM,
            task) -> dict:
    scale = args.scale
    iterations = budget or max(args.min_iterations, args.iterations_per_lane * k * samples)
    settings = LLMSettings(model="standin", base_url=server.base_url, max_retries=2, backoff_s=0.01,
                           timeout_s=600)
    config = SearchConfig(budget=Budget(iterations=iterations), parallel_cycles=k, stagnation_window=3,
                          samples=samples,
                          planner="llm", planner_llm=settings, coder_llm=settings, confirm_new_best=False,
                          timing_budget_s=0.05)
    seed = 1000 * workers + k
    if pool_kind == "ray":
        pool = ray_standin_pool(workers, args.eval_s * scale, args.eval_jitter_s * scale, seed)
        clock = time.time
    elif args.evaluator == "real":
        pool = EvaluationPool([Slot(f"cpu{i}", "cpu", None, SubprocessEvaluator(timeout_s=300, time_budget_s=0.05))
                               for i in range(workers)])
        clock = time.monotonic
    else:
        pool = EvaluationPool([Slot(f"slot{i}", "standin", None,
                                    StandInEvaluator(args.eval_s * scale, args.eval_jitter_s * scale, seed + i))
                               for i in range(workers)])
        clock = time.monotonic
    with tempfile.TemporaryDirectory() as tmp:
        run = start(TASK, Path(tmp) / "run", config)
        ctx = make_context(run, evaluator=pool)
        t0, c0, cpu0, llm0 = time.perf_counter(), clock(), time.process_time(), server.latency_total
        drive(run, ctx, fresh=True)
        wall, c1, cpu = time.perf_counter() - t0, clock(), time.process_time() - cpu0
        attempts = [a for a in ctx.store.attempts() if a["prompt_kind"] != "seed"]
        llm_s = server.latency_total - llm0
        eval_s = sum(a["eval_s"] for a in ctx.store.attempts())
        ctx.store.close()
    n = len(attempts)
    intervals = list(pool.intervals)
    # The steady window opens with the first search evaluation (the seed is measured during start-up).
    first = min(i.start for i in intervals if i.attempt_id != "seed")
    last = max(i.end for i in intervals)
    return {
        "pool": pool_kind, "workers": workers, "k": k, "samples": samples, "iterations": n, "wall_s": round(wall, 2),
        "iterations_per_hour": round(n / wall * 3600 * scale, 1),
        "busy_steady": round(utilisation(intervals, workers, first, last), 3),
        "busy_run": round(utilisation(intervals, workers, c0, c1), 3),
        "startup_s": round((first - c0) / scale, 1),  # full scale: until the first evaluation starts
        # Serial runs only: wall time outside the LLM and the evaluator, per iteration (not scaled).
        "overhead_ms_per_iteration": round(1000 * (wall - llm_s - eval_s) / n, 1) if k == 1 and workers == 1 else None,
        "driver_cpu_ms_per_iteration": round(1000 * cpu / n, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pool", choices=["local", "ray", "both"], default="both")
    ap.add_argument("--workers", default="1,2,4,8")
    ap.add_argument("-k", default="1,2,4,8,16")
    ap.add_argument("--llm-s", type=float, default=30.0)
    ap.add_argument("--llm-jitter-s", type=float, default=10.0)
    ap.add_argument("--eval-s", type=float, default=15.0)
    ap.add_argument("--eval-jitter-s", type=float, default=5.0)
    ap.add_argument("--scale", type=float, default=0.05, help="every LLM and evaluation time is multiplied by this")
    ap.add_argument("--iterations-per-lane", type=int, default=4, help="iteration budget = this x k (at least "
                                                                            "--min-iterations)")
    ap.add_argument("--min-iterations", type=int, default=8)
    ap.add_argument("--samples", type=int, default=1, help="code generations per step, evaluated side by side")
    ap.add_argument("--extra", default="", help="more cells after the grid, W:KxS[:BUDGET],...: W workers, K lanes, "
                                                "S samples, an iteration budget (default per lane)")
    ap.add_argument("--evaluator", choices=["standin", "real"], default="standin")
    ap.add_argument("--out", help="write every row as JSON here")
    args = ap.parse_args()
    os.environ.setdefault("OPENAI_API_KEY", "standin")
    task = load_task(TASK)
    kinds = ["local", "ray"] if args.pool == "both" else [args.pool]
    workers = [int(w) for w in args.workers.split(",") if w]
    ks = [int(k) for k in args.k.split(",") if k]
    cells = {w: [(k, args.samples, None) for k in ks] for w in workers}
    for spec in filter(None, args.extra.split(",")):
        m = re.fullmatch(r"(\d+):(\d+)x(\d+)(?::(\d+))?", spec)
        if m is None:
            ap.error(f"--extra wants W:KxS[:BUDGET] cells like 8:16x2:192, not {spec!r}")
        w, k, s, budget = (int(g) if g else None for g in m.groups())
        cells.setdefault(w, []).append((k, s, budget))
    rows = []
    with StandInLLM(task, args.llm_s * args.scale, args.llm_jitter_s * args.scale) as server:
        for kind in kinds:
            for w in sorted(cells):
                if kind == "ray":  # a local Ray of exactly w logical GPUs
                    import ray

                    # address="local": a Ray of its own, even beside a running cluster (which ray.init() would join)
                    ray.init(address="local", num_cpus=2, num_gpus=w, include_dashboard=False, log_to_driver=False)
                    warm = ray.remote(num_gpus=1, num_cpus=0)(pause)  # start the w worker processes first
                    ray.get([warm.remote(0.5) for _ in range(w)])
                    dispatch = ray_dispatch_ms()
                for k, samples, budget in cells[w]:
                    row = run_one(args, kind, w, k, samples, budget, server, task)
                    if kind == "ray":
                        row["ray_dispatch_ms"] = dispatch
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                if kind == "ray":
                    ray.shutdown()
    serial = {r["pool"]: r for r in rows if r["workers"] == 1 and r["k"] == 1 and r["samples"] == 1}
    print("\n| pool | workers | k x samples | iterations | iterations/hour | x serial | busy (steady) | busy (run) | "
          "start-up s | driver CPU ms/iter |\n|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        base = serial.get(r["pool"])
        speedup = f"{r['iterations_per_hour'] / base['iterations_per_hour']:.2f}" if base else "-"
        print(f"| {r['pool']} | {r['workers']} | {r['k']}x{r['samples']} | {r['iterations']} | {r['iterations_per_hour']:.0f} | "
              f"{speedup} | {r['busy_steady']:.0%} | {r['busy_run']:.0%} | {r['startup_s']:.0f} | "
              f"{r['driver_cpu_ms_per_iteration']} |")
    for kind, r in serial.items():
        print(f"serial loop ({kind}): graph overhead {r['overhead_ms_per_iteration']} ms per iteration")
    for w in sorted({r["workers"] for r in rows if "ray_dispatch_ms" in r}):
        ms = next(r["ray_dispatch_ms"] for r in rows if r["workers"] == w and "ray_dispatch_ms" in r)
        print(f"Ray dispatch ({w} GPUs): {ms} ms per no-op task; the scaled evaluation is "
              f"{1000 * args.eval_s * args.scale:.0f} ms")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
