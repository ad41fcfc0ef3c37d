"""Planted cheats that forge the timing from inside the candidate's process, against the harness's own objects.

Each tests/cheats/forge_*.py candidate (but forge_result and forge_later, which forge the result file: test_cheats.py)
computes the right answer honestly and attacks the timer that measures it: found through the garbage collector, by
walking frames, tracebacks or threads' frames, through the runner's module, or by walking the object graph; changed by
rebinding, by swapping code, by editing closure cells, through ctypes, by a trace or profile function that rewrites
the timer's frame's locals, by a thread that patches and restores, by a
clock that restores itself, or by rewriting the message that carries the timings. Every one must be judged
``suspicious`` (harness/candidate/audit.py blocks the search, harness/candidate/integrity.py sees the change, harness/judge/time_bound.py's
clock contradicts what an attacker that blinded both reports), on CPU here and on a GPU
(``pytest -m '' tests/test_forgery.py`` on the GPU host), and the honest candidate must still pass.
"""

from __future__ import annotations

import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ksearch_graph.harness.parent.client import SubprocessEvaluator
from ksearch_graph.tasks.evaluation import EvalResult, Status
from ksearch_graph.tasks.task import load_task

pytestmark = pytest.mark.slow  # every test runs whole evaluations (judge and candidate processes)

CHEATS = Path(__file__).resolve().parent / "cheats"
# What each cheat must be caught by, as the log names it: audit.py's block or integrity.py's change.
BLOCKED, CHANGED = "reached for the harness's own objects", "changed the harness's own objects"
BOUND = "the judge's clock"  # harness/judge/time_bound.py: what an attacker that blinds the in-process guards meets
SCHEMA = "the protocol does not allow"  # harness/wire.py: a forged clock that sent a negative time
FORGERIES = {
    "forge_gc_class": BLOCKED, "forge_gc_scan": BLOCKED, "forge_thread_frames": BLOCKED,
    "forge_getframe_depth": BLOCKED, "forge_code": BLOCKED, "forge_ctypes": BLOCKED, "forge_object_walk": BLOCKED,
    "forge_trace_locals": BLOCKED, "forge_profile_locals": BLOCKED,
    "forge_frames": (CHANGED, SCHEMA), "forge_traceback": (CHANGED, SCHEMA), "forge_runner_class": CHANGED,
    "forge_cell": CHANGED,
    "forge_patch_restore": CHANGED, "forge_self_restoring": CHANGED,
    "forge_message": CHANGED, "forge_blind_guard": BOUND,
}
# Forgeries that only a GPU timer meets (on CPU they are honest): the judge's clock must catch them there.
GPU_FORGERIES = {"forge_rerecord_event": BOUND}
GPU_PARAMS = {"square": {"m": 2048, "k": 2048, "n": 2048}, "skinny": {"m": 16, "k": 4096, "n": 2048}}


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def show(r: EvalResult) -> str:
    return f"status={r.status.value} score={r.score:.4g} latency_us={r.latency_us}\nlog_excerpt:\n{r.log_excerpt}"


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, EvalResult]:
    import json

    folder = tmp_path_factory.mktemp("forgery-task") / "task"
    shutil.copytree(CHEATS / "task", folder)
    on_gpu = _cuda()
    if on_gpu:
        spec = json.loads((folder / "task.json").read_text())
        for w in spec["workloads"]:
            w["params"] = GPU_PARAMS[w["name"]]
        (folder / "task.json").write_text(json.dumps(spec, indent=2))
    task = load_task(folder)
    workdir = tempfile.mkdtemp(prefix="kf-")  # short: AF_UNIX socket paths live under it
    ev = SubprocessEvaluator(timeout_s=300 if on_gpu else 180, time_budget_s=0.5 if on_gpu else 0.2, workdir=workdir)
    names = ["honest", *FORGERIES, *(GPU_FORGERIES if on_gpu else {})]

    def run(name: str) -> EvalResult:
        return ev.evaluate(task, {"kernel.py": (CHEATS / f"{name}.py").read_text()}, attempt_id=f"forgery-{name}")

    try:
        with ThreadPoolExecutor(max_workers=1 if on_gpu else 2) as pool:
            yield dict(zip(names, pool.map(run, names)))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def test_the_honest_candidate_still_passes(results):
    r = results["honest"]
    assert r.status == Status.passed and r.score > 0, show(r)


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_forging_the_timer_is_suspicious(results, name):
    if _cuda():
        pytest.skip("on a GPU host the GPU variant below judges these")
    r = results[name]
    assert r.status == Status.suspicious and r.score == 0, show(r)
    caught_by = FORGERIES[name] if isinstance(FORGERIES[name], tuple) else (FORGERIES[name],)
    assert any(c in r.log_excerpt for c in caught_by), show(r)
    if FORGERIES[name] == BOUND:  # the judge times a contradicted burst again once: a forged clock lies again
        assert "timed before them" in r.log_excerpt, show(r)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(FORGERIES | GPU_FORGERIES))
def test_forging_the_timer_is_suspicious_on_a_gpu(results, name):
    """The same cheats where the timer reads CUDA events: on the GPU host, ``pytest -m gpu tests/test_forgery.py``."""
    assert _cuda(), "needs a CUDA GPU"
    r = results[name]
    assert r.status == Status.suspicious and r.score == 0, show(r)
    if name in GPU_FORGERIES:
        assert GPU_FORGERIES[name] in r.log_excerpt, show(r)
