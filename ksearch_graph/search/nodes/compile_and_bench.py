"""Compile-and-bench: hand the pending attempt to the evaluator and record the result.

Idempotent: an attempt already in the store (the process died after recording it, before the
checkpoint) is taken from there, never evaluated twice. Failures are results, never exceptions.

A candidate that looks like a new global best is measured a second time and keeps the lower of the
two scores (docs/method.md: no new best on one noisy measurement); one that fails the second run is
treated as failed.

The samples of a step (``samples`` > 1) are evaluated side by side, each on its own lease of the evaluator's pool;
every one is recorded, and the best (passing, highest score; else the first) is the step's result.

An attempt is evaluated only with its iteration claimed from the run's budget (budget.py): a resume with a smaller
budget does not evaluate code generated before it. A failure the candidate did not cause is not its result
(infrastructure.py): it is retried, and stops the run when the infrastructure is down.
"""

from __future__ import annotations

import time

from langgraph.runtime import Runtime

from ksearch_graph.harness.parent.failures import infrastructure_error
from ksearch_graph.rundir.store import attempt_summary
from ksearch_graph.search.context import SearchContext, search_context
from ksearch_graph.search.events import AttemptEvent, InfrastructureEvent
from ksearch_graph.search.infrastructure import TRIES, evaluate_guarded
from ksearch_graph.search.state import CycleState
from ksearch_graph.search.streaming import emit, side_by_side
from ksearch_graph.tasks.evaluation import EvalResult, Status


def _evaluate(ctx: SearchContext, runtime: Runtime[SearchContext], files: dict[str, str], attempt_id: str) -> EvalResult:
    """The candidate's own result: failures outside it are tried again and never returned (infrastructure.py)."""

    def once(candidate: dict[str, str], label: str) -> EvalResult:
        try:
            return ctx.evaluator.evaluate(ctx.task, candidate, attempt_id=label)
        except Exception as e:  # the evaluator should not raise; if it does, it failed, not the candidate
            return infrastructure_error("the evaluator failed", f"{type(e).__name__}: {e}")

    def failed(result: EvalResult, try_number: int) -> None:
        emit(runtime, InfrastructureEvent(
            attempt_id=attempt_id, reason=result.infrastructure, try_number=try_number, tries=TRIES,
            slot=result.environment.get("pool_slot") or result.environment.get("ray_node")))

    return evaluate_guarded(once, files, attempt_id, control=control_files(ctx, files), reference=ctx.task.spec.reference,
                            on_failure=failed)


def control_files(ctx: SearchContext, candidate: dict[str, str]) -> dict[str, str] | None:
    """Code known to pass, to tell a broken infrastructure from a candidate that breaks it: the task's seed once it
    passed here, else the run's best passing attempt; None when there is none (or it is the candidate itself)."""
    passed = [a for a in ctx.store.attempts() if a["status"] == "passed"]
    if not passed:
        return None
    best = max(passed, key=lambda a: (a["prompt_kind"] == "seed", a["score"]))
    files = ctx.store.get_source(best["source_hash"])
    return None if files == candidate else files


def evaluate_once(
    ctx: SearchContext,
    runtime: Runtime[SearchContext],
    *,
    attempt_id: str,
    cycle_id: str,
    node_id: str,
    prompt_kind: str,
    files: dict[str, str] | None = None,
    pending: dict | None = None,
    confirm_above: float | None = None,
    best_before: float = 0.0,
) -> dict:
    """Evaluate and record one attempt (or return its stored row). Returns the store row."""
    row = ctx.store.get_attempt(attempt_id)
    if row is not None:
        return row
    pending = pending or {}
    if files is not None:
        source = ctx.store.put_source(files)
    else:
        source = pending.get("source_hash")
        files = ctx.store.get_source(source) if source else None
    started = time.monotonic()
    if not files:
        result = EvalResult(status=Status.compile_error, log_excerpt=pending.get("error") or "the answer had no code")
    else:
        result = _evaluate(ctx, runtime, files, attempt_id)
        if result.passed and confirm_above is not None and result.score > confirm_above:
            again = _evaluate(ctx, runtime, files, attempt_id)
            first_score = result.score
            if not again.passed or again.score < result.score:
                result = again
            result.environment["confirmation_scores"] = [first_score, again.score]
    row = ctx.store.record_attempt(
        attempt_id=attempt_id,
        cycle_id=cycle_id,
        node_id=node_id,
        prompt_kind=prompt_kind,
        base_attempt_id=pending.get("base_attempt_id"),
        parent_attempt_id=pending.get("parent_attempt_id"),
        source_hash=source or "",
        result=result,
        prompt_tokens=pending.get("prompt_tokens", 0),
        completion_tokens=pending.get("completion_tokens", 0),
        codegen_s=pending.get("codegen_s", 0.0),
        eval_s=time.monotonic() - started,
    )
    ctx.budget.release(attempt_id)
    floor = ctx.speed_of_light().fractions(result)
    emit(runtime, AttemptEvent(
        attempt_id=attempt_id, cycle_id=cycle_id, node_id=node_id,
        iteration=row["iteration"], prompt_kind=prompt_kind, status=row["status"],
        score=row["score"], latency_us=row["latency_us"], log=row["log_excerpt"][:200],
        best_score=max(best_before, row["score"] if row["status"] == "passed" else 0.0),
        tokens=ctx.store.token_totals()["total_tokens"], floor_fraction=floor.fraction if floor else None,
        implausible=bool(floor and floor.implausible)))
    return row


def compile_and_bench(state: CycleState, runtime: Runtime[SearchContext]) -> dict:
    ctx = search_context(runtime)
    cycle = state["cycle"]
    if state.get("pending") is None:  # instantiate_code halted the cycle: nothing to evaluate
        return {}
    samples = state.get("pending_samples") or [state["pending"]]
    granted = set(ctx.budget.claim([p["id"] for p in samples]))
    if not granted:
        return {"pending": None, "pending_samples": None,
                "halt": ctx.budget.iteration_stop_reason() or "iteration budget spent"}
    samples = [p for p in samples if p["id"] in granted]
    cycle_best = state.get("cycle_best")
    bar = max(cycle["best_score_at_start"] or 0.0, cycle_best["score"] if cycle_best else 0.0)

    def bench(pending: dict) -> dict:
        return evaluate_once(
            ctx,
            runtime,
            attempt_id=pending["id"],
            cycle_id=cycle["id"],
            node_id=cycle["node_id"],
            prompt_kind=pending["prompt_kind"],
            pending=pending,
            # Nothing to beat yet means nothing to confirm against.
            confirm_above=bar * (1 + ctx.config.noise_margin) if ctx.config.confirm_new_best and bar > 0 else None,
            best_before=bar,
        )

    rows = side_by_side(bench, samples)
    passed = [r for r in rows if r["status"] == "passed"]
    row = max(passed, key=lambda r: r["score"]) if passed else rows[0]
    return {"last": attempt_summary(row), "n_attempts": state.get("n_attempts", 0) + len(rows), "pending": None,
            "pending_samples": None}
