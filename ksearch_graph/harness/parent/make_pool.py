"""Which evaluator a search gets: the local pool (default) or a Ray pool, from the command line's pool options.

Pool options belong to the machine a search runs on, not to the search: they are not saved in run.json, and a
resumed run may use another pool (a search compares scores within one GPU model; see pool.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from ksearch_graph.config import SearchConfig
from ksearch_graph.harness.parent.client import SubprocessEvaluator, gpu_driver_present
from ksearch_graph.harness.parent.pool import PoolError
from ksearch_graph.tasks.evaluation import Evaluator
from ksearch_graph.tasks.task import Task


@dataclass
class PoolOptions:
    gpus: str | None = None  # local: "0,1,3"; Ray: a count, "4"; None: every visible GPU (every GPU of the cluster)
    cpu_slots: int | None = None  # without a GPU; None: default_cpu_slots()
    ray: bool = False
    ray_address: str | None = None  # "auto" | "ray://HOST:PORT"; None with ray: a local Ray
    gpu_model: str | None = None  # Ray: the accelerator type to run on (a mixed cluster needs it)
    lanes_per_gpu: int | None = None  # evaluations at once on one GPU; None: lanes_for(config)


MAX_DEFAULT_LANES = 4


def lanes_for(config: SearchConfig) -> int:
    """Evaluations at once on one GPU by default: as many as the search issues at once (k cycles x samples), at most
    four. One lane times while the others start, import, compile and check (harness/judge/gpu_share.py); each lane
    holds two prestarted processes with a CUDA context (about 0.5 GB of GPU memory each)."""
    return max(1, min(MAX_DEFAULT_LANES, config.parallel_cycles * config.samples))


def evaluator_settings(config: SearchConfig) -> dict:
    """SubprocessEvaluator's settings for a search (the same on a Ray worker)."""
    budget = config.timing_budget_s or (1.0 if gpu_driver_present() else 0.25)
    return {"timeout_s": config.eval_timeout_s, "time_budget_s": budget, "sandbox": config.sandbox}


def make_pool(options: PoolOptions, config: SearchConfig, task: Task | None = None) -> Evaluator:
    settings = evaluator_settings(config)
    lanes = options.lanes_per_gpu or lanes_for(config)
    if options.ray or options.ray_address:
        from ksearch_graph.harness.parent.ray_pool import RayPool

        return RayPool.connect(options.ray_address, settings=settings, gpu_model=options.gpu_model,
                               cpu_slots=options.cpu_slots, gpus=ray_gpu_count(options.gpus), lanes=lanes)
    from ksearch_graph.harness.parent.pool import local_pool

    pool = local_pool(lambda env: SubprocessEvaluator(**settings, env=env), gpus=options.gpus,
                      cpu_slots=options.cpu_slots, lanes=lanes)
    for slot in pool.slots:  # a GPU's lanes time its reference once between them
        first = pool.lanes_of(slot)[0]
        if first is not slot:
            slot.evaluator.share_reference_timings(first.evaluator)
    # On a GPU host: the first evaluations' torch imports and reference timings overlap the first LLM turns.
    pool.start_ahead(task)
    return pool


def ray_gpu_count(gpus: str | None) -> int | None:
    """``--gpus`` on Ray: how many of the cluster's GPUs the search uses at once (device indices mean nothing across
    nodes)."""
    if gpus is None:
        return None
    try:
        count = int(gpus)
    except ValueError:
        count = 0
    if count < 1:
        raise PoolError(f"--gpus {gpus}: on Ray, --gpus is how many of the cluster's GPUs to use at once (e.g. "
                        "--gpus 4); GPU indices choose GPUs of this machine only")
    return count
