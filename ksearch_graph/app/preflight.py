"""Preflight: before a search spends anything, the pool it will use must work, and so must the task.

``ksearch run`` and ``ksearch campaign`` run it before a run directory is made and before the first LLM call;
``ksearch resume`` runs the pool's part (and the task's, for a run that has not measured its seed yet).

0. The sandbox the candidates run in (harness/judge/sandbox.py): where the pool's evaluations use bubblewrap and this host
   cannot make one, the local pool is never made (``SandboxUnavailable``) and the run stops here, with the install
   hint; ``--sandbox none`` runs candidates without it.
1. The pool: every GPU slot of the local pool, one probe for its CPU slots (they share this machine and its Python),
   every node of a Ray cluster that has the resource the pool asks for. A fresh process there imports the package
   (the version here), torch, and reports its GPU model; on a GPU it runs a small CUDA operation (the GPU's health);
   where the evaluations use bubblewrap, it makes a sandbox there.
2. The task: its seed is evaluated in the harness on the pool, so its reference runs and its seed passes. A task
   without a seed has its reference stand in as the candidate where its language is Python.

A failure raises ``PreflightFailed`` with the reason before anything is written: ``task=True`` for the task's own
failure (exit code 2: fix the task), else the pool's (exit code 69: fix the pool or the cluster). The seed's
evaluation is kept (``Preflight.seed``): the search records it as its seed's measurement instead of measuring again.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ksearch_graph import __version__
from ksearch_graph.harness.parent.failures import infrastructure_error
from ksearch_graph.harness.parent.ray_shipping import package_digest
from ksearch_graph.rundir.gpu_record import describe, same_model
from ksearch_graph.search.infrastructure import InfrastructureDown, evaluate_guarded
from ksearch_graph.tasks.evaluation import EvalResult, error_headline
from ksearch_graph.tasks.task import Task

PROBE_TIMEOUT_S = 180

# Run in a fresh process on each slot or node: what it reports is what an evaluation there would meet.
PROBE = r"""
import json, sys
out = {"python": sys.version.split()[0], "version": None}
try:
    import ksearch_graph
    import ksearch_graph.harness.parent.client  # what every evaluation there imports
    from ksearch_graph.harness.parent.ray_shipping import package_digest
    from ksearch_graph.harness.judge.sandbox import unavailable_reason
    out["version"], out["digest"] = ksearch_graph.__version__, package_digest()
    out["sandbox_error"] = unavailable_reason()
except BaseException as e:
    out["import_error"] = f"{type(e).__name__}: {e}"
try:
    import torch
    out["torch"] = torch.__version__
    if torch.cuda.is_available():
        out["gpu_model"] = torch.cuda.get_device_name(0)
        x = torch.ones(1 << 20, device="cuda")
        torch.cuda.synchronize()
        out["healthy"] = float(x.sum()) == float(1 << 20)
except BaseException as e:
    out["torch_error"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


class PreflightFailed(Exception):
    def __init__(self, message: str, *, task: bool = False):
        super().__init__(message)
        self.task = task  # the task's own failure (its reference or seed), not the pool's


@dataclass
class Preflight:
    slots: list[dict] = field(default_factory=list)  # one probe per slot or node: {"where", "version", ...}
    result: EvalResult | None = None  # the seed's (or stand-in's) evaluation; None when not evaluated
    files: dict[str, str] | None = None
    evaluated: str = ""  # "seed", "reference (standing in for a seed)", or "" (not evaluated)
    seconds: float = 0.0

    @property
    def seed(self) -> EvalResult | None:
        """The seed's measurement, for the search to record as its own."""
        return self.result if self.evaluated == "seed" else None

    def summary(self) -> str:
        torch = ", ".join(sorted({s.get("torch") or "?" for s in self.slots})) or "?"
        where = "; ".join(s["where"] for s in self.slots) or "the evaluator"
        task = {"": "the task was not evaluated (no seed, and its language is not Python)",
                "seed": "the task's reference runs and its seed passes"}.get(
            self.evaluated, "the task's reference runs (it has no seed)")
        return f"preflight: {where}: ksearch-graph {local_version()}, torch {torch}; {task} [{self.seconds:.1f} s]"


def local_version() -> str:
    return __version__


def preflight(pool, task: Task, *, check_task: bool = True) -> Preflight:
    """Probe every slot of ``pool`` and (``check_task``) evaluate the task's seed on it; PreflightFailed if not fit."""
    started = time.monotonic()
    out = Preflight(slots=probe_pool(pool))
    if check_task:
        out.files, out.result, out.evaluated = check_task_on(pool, task)
    out.seconds = time.monotonic() - started
    return out


# ---------------------------------------------------------------------------------------------------- the pool


def probe_pool(pool) -> list[dict]:
    if hasattr(pool, "slots") and isinstance(pool.slots, list):
        reports = _probe_local(pool)
    elif type(pool).__name__ == "RayPool":
        reports = _probe_ray(pool)
    else:  # an evaluator that is no pool (a test's): nothing to probe
        return []
    expected_model, sandbox = getattr(pool, "model", None), sandbox_of(pool)
    shipped = type(pool).__name__ == "RayPool"
    problems = [p for r in reports if (p := _problem(r, expected_model, sandbox, shipped=shipped))]
    if problems:
        raise PreflightFailed("the evaluation pool is not fit to run the search, so nothing was started:\n  "
                              + "\n  ".join(problems))
    return reports


def sandbox_of(pool) -> str:
    """The sandbox the pool's evaluations run candidates in: "bwrap" or "none" (SubprocessEvaluator's ``sandbox``)."""
    if isinstance(getattr(pool, "settings", None), dict):  # a Ray pool: its workers' settings
        return pool.settings.get("sandbox", "bwrap")
    slots = getattr(pool, "slots", None)
    evaluator = slots[0].evaluator if isinstance(slots, list) and slots else pool
    return getattr(evaluator, "sandbox", "bwrap")


def sandbox_failure(reason: str, where: str = "this host") -> PreflightFailed:
    """The run cannot start: candidates would run in bubblewrap, which ``where`` cannot make (``reason`` carries
    harness/judge/sandbox.py's install hint)."""
    return PreflightFailed(f"candidates run in a sandbox, and {where} cannot make one: {reason}")


def _problem(report: dict, model: str | None, sandbox: str = "bwrap", *, shipped: bool = False) -> str | None:
    """What makes a slot or node unfit, or None. ``shipped``: a Ray node, which gets this package with each
    evaluation (ray_shipping.py) and needs only Ray and torch of its own."""
    where, version = report["where"], local_version()
    if report.get("error"):
        return f"{where}: {report['error']}"
    if report.get("import_error"):
        if shipped:
            return (f"{where}: the package shipped to it cannot be imported there ({report['import_error']}); its "
                    f"workers need Python {sys.version.split()[0]} and Ray like this machine's, with torch")
        return (f"{where}: the package cannot be imported there ({report['import_error']}); install ksearch-graph "
                f"{version} (with torch) on every node, in the Python the workers run")
    if report.get("version") != version or report.get("digest", package_digest()) != package_digest():
        return (f"{where}: its ksearch_graph ({report.get('version') or '(none)'}, code {report.get('digest')}) is "
                f"not this one ({version}, code {package_digest()}): another copy comes first on its import path")
    if report.get("torch_error"):
        return f"{where}: torch cannot be used there ({report['torch_error']})"
    if sandbox == "bwrap" and report.get("sandbox_error"):
        return f"{where}: the candidates' sandbox cannot be made there: {report['sandbox_error']}"
    found = report.get("gpu_model") or "cpu"
    if model is not None and model not in ("cpu", "gpu") and not same_model(found, model):
        return f"{where}: its GPU is {describe(found)}, the pool's model is {describe(model)}"
    if report.get("gpu_model") and report.get("healthy") is not True:
        return f"{where}: its GPU ({report['gpu_model']}) fails a small CUDA operation (a broken GPU?)"
    return None


def _probe_local(pool) -> list[dict]:
    """Each GPU slot on its own GPU; the CPU slots once (one machine, one Python)."""
    gpu_slots = [s for s in pool.slots if s.gpu is not None]
    slots = gpu_slots or pool.slots[:1]

    def probe(slot) -> dict:
        env = dict(getattr(slot.evaluator, "env", {}) or {})
        where = f"slot {slot.name}" if slot.gpu is not None else f"{len(pool.slots)} CPU slot(s)"
        python = getattr(slot.evaluator, "python", sys.executable)
        return {"where": where, **_run_probe([python, "-c", PROBE], env)}

    with ThreadPoolExecutor(max(1, len(slots))) as workers:
        return list(workers.map(probe, slots))


def _run_probe(cmd: list[str], env: dict[str, str]) -> dict:
    import os

    try:
        proc = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"the probe did not finish in {PROBE_TIMEOUT_S} s"}
    except OSError as e:
        return {"error": f"cannot start {cmd[0]}: {e}"}
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"the probe exited with code {proc.returncode}: {tail}"}


def _probe_ray(pool) -> list[dict]:
    """One probe per alive node with the resource the pool's evaluations ask for, pinned to that node."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from ksearch_graph.harness.parent.ray_pool import plain

    wanted = [k for k in ("GPU", "CPU") if pool.options.get(f"num_{k.lower()}s")] or ["CPU"]
    kind = pool.options.get("accelerator_type")
    nodes = [n for n in ray.nodes() if n.get("Alive") and n["Resources"].get(wanted[0], 0) >= 1
             and (kind is None or n["Resources"].get(f"accelerator_type:{kind}"))]
    if not nodes:
        return [{"where": "the Ray cluster", "error": f"no alive node has a {wanted[0]} for an evaluation"}]
    remote = ray.remote(max_retries=0)(_node_probe())
    refs = {n["NodeManagerAddress"] + f" ({n['NodeID'][:8]})": remote.options(
        **pool.options, **pool.task_options,
        scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(PROBE)
        for n in nodes}
    reports = []
    for where, ref in refs.items():
        try:
            report = ray.get(ref, timeout=PROBE_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            report = {"error": f"its probe did not start or finish in {PROBE_TIMEOUT_S} s (no free slot, or the "
                               "worker cannot start)"}
        except ray.exceptions.RayError as e:
            report = {"error": f"its probe failed: {type(e).__name__}: "
                               f"{(plain(str(e)).strip().splitlines() or [''])[-1][:300]}"}
        reports.append({"where": f"Ray node {where}", **report})
    return reports


def _node_probe():
    """The function a Ray worker runs, made here so that Ray ships it by value: it runs where the package is
    missing, and says so."""

    def probe(script: str) -> dict:
        import json as _json
        import subprocess as _subprocess
        import sys as _sys

        proc = _subprocess.run([_sys.executable, "-c", script], capture_output=True, text=True, timeout=170)
        try:
            return _json.loads(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            return {"error": f"the probe exited with code {proc.returncode}: {tail}"}

    return probe


# ---------------------------------------------------------------------------------------------------- the task


def stand_in(task: Task) -> tuple[dict[str, str] | None, str]:
    """The code that shows the task works: its seed, else its reference under the entry point's name (a Python
    solution only), else None. With what it is, for messages."""
    if task.seed_source is not None:
        return {task.spec.solution_file: task.seed_source}, "seed"
    if task.spec.solution_file.endswith(".py") and task.spec.language in ("triton", "pytorch"):
        # The reference runs in a module of its own: its `reference` may call a function named like the entry point
        # (a FlashInfer-Trace definition's `run`), which an alias in the same namespace would turn into a recursion.
        code = ("import types as _types\n\n"
                "_reference = _types.ModuleType('reference')\n"
                f"exec(compile({task.reference_source!r}, 'reference.py', 'exec'), _reference.__dict__)\n"
                f"{task.spec.entry_point} = _reference.reference\n")
        return {task.spec.solution_file: code}, "reference (standing in for a seed)"
    return None, ""


def check_task_on(pool, task: Task) -> tuple[dict[str, str] | None, EvalResult | None, str]:
    """Evaluate the task's seed (or its stand-in) on the pool: (its files, its result, what it was) when it passes."""
    files, what = stand_in(task)
    if files is None:
        return None, None, ""

    def once(candidate: dict[str, str], label: str) -> EvalResult:
        try:
            return pool.evaluate(task, candidate, attempt_id=label)
        except Exception as e:  # the evaluator should not raise; it failed, not the task
            return infrastructure_error("the evaluator failed", f"{type(e).__name__}: {e}")

    try:
        result = evaluate_guarded(once, files, "preflight", control=None, reference=task.spec.reference)
    except InfrastructureDown as e:
        if all(r.startswith("the task's reference") for r in e.reasons):
            raise PreflightFailed(f"task {task.name}: its reference fails in the harness ({e.detail}); fix the task",
                                  task=True) from None
        raise PreflightFailed(f"evaluating task {task.name}'s {what} on the pool failed {len(e.reasons)} times outside "
                              f"the task's code ({'; '.join(dict.fromkeys(e.reasons))}): {e.detail}") from None
    if result.status.value == "unavailable":  # the machine, not the task's code: no GPU, memory, a module
        why = (result.log_excerpt or "no reason given").strip().splitlines()[0]
        raise PreflightFailed(f"task {task.name} cannot be evaluated on this pool: {why}", task=True)
    if not result.passed:
        headline = error_headline(result.log_excerpt) or result.status.value
        raise PreflightFailed(f"task {task.name}: its {what} does not pass in the harness ({result.status.value}: "
                              f"{headline}); fix the task (a search compares every candidate with it)", task=True)
    return files, result, what
