"""The GPU model a run's scores are measured on, and the check that a resumed run keeps to it.

A score is a speed-up measured on one GPU model; scores from two models do not compare, so one search keeps to one.
The run records its pool's model in store.sqlite (meta ``gpu_models``: every model it was evaluated on, in order,
with the iteration it began at). It lives in the store, not in run.json: run.json holds the search's settings, and
the pool belongs to the machine; the store holds what was measured, and a branch or ``ksearch recover`` keeps it.

The model is recorded when a search context is made, before the first evaluation; while the run has evaluated
nothing it is only provisional (the next pool replaces it). Afterwards a pool of another model stops the search
before anything is written (``GpuModelChanged``, a usage error) unless the change is allowed: then it is logged
(event ``gpu_changed``) and appended to ``gpu_models``, and the report says where the scores stop comparing.
"""

from __future__ import annotations

import json
import re

from ksearch_graph.rundir.run_dir import RunDirError
from ksearch_graph.rundir.store import RunStore

_VENDOR_WORDS = {"nvidia", "amd"}


class GpuModelChanged(RunDirError):
    pass


def model_words(name: str) -> set[str]:
    """A GPU name's words, vendor left out, memory sizes as ``80gb`` (Ray writes ``A100-80G``)."""
    words = set(re.findall(r"[a-z0-9]+", name.lower())) - _VENDOR_WORDS
    return {w + "b" if re.fullmatch(r"\d+g", w) else w for w in words}


def same_model(a: str, b: str) -> bool:
    """Whether two names are one GPU model. The local pool says ``NVIDIA H100 80GB HBM3`` and Ray ``H100``: the
    names' words must be the same, or those of one among the other's."""
    words_a, words_b = model_words(a), model_words(b)
    return bool(words_a and words_b) and (words_a <= words_b or words_b <= words_a)


def describe(model: str) -> str:
    return "CPU slots (no GPU)" if model == "cpu" else model


def recorded_model(store: RunStore) -> str | None:
    """The model the run's scores were measured on: the last one recorded, else (a run from before the record)
    the model its latest evaluation names."""
    models = store.get_meta("gpu_models") or []
    if models:
        return models[-1]["model"]
    for row in reversed(store.attempts()):
        model = json.loads(row["result"] or "{}").get("environment", {}).get("gpu_model")
        if model:
            return model
    return None


def check_gpu_model(store: RunStore, model: str | None, *, run_path, allow_change: bool = False,
                    record: bool = True) -> str | None:
    """Record ``model`` (the pool's) for the run, or refuse it: GpuModelChanged when the run has scores measured
    on another model and ``allow_change`` is False. Returns a note to show when an allowed change was recorded.
    ``record=False`` only refuses (a check before it is known that anything will run). An evaluator that names no
    model (tests' stand-ins) is not checked."""
    if model is None:
        return None
    recorded = recorded_model(store)
    evaluated = len(store.attempts())
    if recorded is None or evaluated == 0:
        if record and store.get_meta("gpu_models") != [{"model": model, "from_iteration": 0}]:
            store.set_meta("gpu_models", [{"model": model, "from_iteration": 0}])
        return None
    if same_model(recorded, model):
        if record and not store.get_meta("gpu_models"):  # a run from before the record: what its results say
            store.set_meta("gpu_models", [{"model": recorded, "from_iteration": 0}])
        return None
    done = store.count_attempts()
    if not allow_change:
        where = ("where the pool is CPU slots (a machine without a GPU, or CUDA_VISIBLE_DEVICES= to hide them)" if recorded == "cpu" else
                 f"where the pool is {recorded} (choose GPUs with --gpus, or --gpu-model on Ray)")
        raise GpuModelChanged(
            f"{run_path} was evaluated on {describe(recorded)} ({evaluated} evaluations; its scores are speed-ups "
            f"measured there), but the evaluation pool here is {describe(model)}. Scores from two GPU models cannot "
            f"be compared within one search, so nothing was changed. Resume it {where}, or pass --allow-gpu-change "
            f"to continue on {describe(model)}: the change is recorded and the report says where the scores stop "
            "comparing.")
    if not record:
        return None
    models = store.get_meta("gpu_models") or [{"model": recorded, "from_iteration": 0}]
    store.set_meta("gpu_models", models + [{"model": model, "from_iteration": done + 1, "allowed": True}])
    store.log_event("gpu_changed", previous=recorded, model=model, iterations_done=done)
    return (f"note: {run_path}: the GPU model changes from {describe(recorded)} to {describe(model)} after iteration {done} "
            "(--allow-gpu-change): scores before and after do not compare")


def keep_to_branch(store: RunStore) -> None:
    """A branch's record: the source's changes of model after the attempts the branch kept are not its past."""
    models = store.get_meta("gpu_models") or []
    kept = [m for i, m in enumerate(models) if i == 0 or m["from_iteration"] <= store.count_attempts()]
    if kept != models:
        store.set_meta("gpu_models", kept)
