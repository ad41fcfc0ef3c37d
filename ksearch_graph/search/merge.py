"""Merging a finished action cycle into the world model: visit counts, closing the node, the planner's edit.

Used by the update node (rounds of cycles) and by rolling lanes (``rolling.py``), which merge each cycle as it ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from langgraph.runtime import Runtime

from ksearch_graph.rundir.store import attempt_summary
from ksearch_graph.search.budget import BudgetSpent
from ksearch_graph.search.context import SearchContext
from ksearch_graph.search.events import CycleOrphanedEvent, EditRejectedEvent, NewBestEvent, WorldModelEvent
from ksearch_graph.search.roles.protocol import Evidence, PlannerOutputError, Usage
from ksearch_graph.search.state import BestEntry
from ksearch_graph.search.streaming import emit
from ksearch_graph.search.world_model import Attachment, WorldModel, close_node, ensure_continuation, record_visit
from ksearch_graph.search.world_model_edits import EditRejected, EditScript, apply_edits
from ksearch_graph.tasks.evaluation import EvalResult


def edit_with_retries(
    ctx: SearchContext,
    key: str,
    ask: Callable[[list[str]], tuple[EditScript, Usage]],
    apply: Callable[[EditScript], WorldModel],
) -> tuple[WorldModel | None, list[str]]:
    errors: list[str] = []
    for attempt in range(ctx.config.max_edit_retries + 1):
        cache_key = f"{key}:{attempt}"
        cached = ctx.store.get_generation(cache_key)
        if cached is None:
            ctx.budget.check_llm_call()  # BudgetSpent: a cap is reached, no planner call starts
            started = time.monotonic()
            try:
                script, usage = ask(errors)
                cached = {"script": script.model_dump(mode="json")}
            except PlannerOutputError as e:
                usage, cached = e.usage, {"errors": e.errors}
            # The planner's thinking time counts toward --max-wall, as the coder's does.
            usage.seconds = time.monotonic() - started
            ctx.store.record_llm_call("planner", key.split(":")[0], usage.as_dict(), usage.seconds)
            ctx.store.record_exchanges(cache_key, "planner", key.split(":")[0], usage.transcript)
            ctx.store.put_generation(cache_key, cached)
        if "errors" in cached:
            errors = cached["errors"]
            continue
        try:
            return apply(EditScript.model_validate(cached["script"])), []
        except EditRejected as e:
            errors = e.errors
    return None, errors


def best_entry(row: dict, node_id: str) -> BestEntry:
    return {
        "attempt_id": row["id"],
        "score": row["score"],
        "latency_us": row["latency_us"],
        "node_id": node_id,
        "source_hash": row["source_hash"],
    }


def merge_cycle(ctx: SearchContext, runtime: Runtime[SearchContext] | None, wm: WorldModel, best: dict | None,
                result: dict, *, iterations: int) -> tuple[WorldModel, dict | None]:
    """One finished cycle into the world model: visit, close on success, the planner's (cached) edit, unless a cap
    allows no planner call. ``runtime`` None: quiet (no events, no snapshot), to get the planner's answer into the
    cache ahead. A cycle that made no attempt (a budget halted it first) is no evidence: nothing changes."""
    if result["n_attempts"] == 0:
        return wm, best
    node_id, cycle_id = result["node_id"], result["cycle_id"]
    say = (lambda event: emit(runtime, event)) if runtime is not None else (lambda event: None)
    if node_id not in wm.nodes:  # pruned meanwhile by another cycle's update: keep the evidence only
        say(CycleOrphanedEvent(cycle_id=cycle_id, node_id=node_id))
        return wm, best
    passed = result["best"] is not None
    wm = record_visit(wm, node_id, failed=not passed)
    evidence = _evidence(ctx, wm, result)
    if passed:
        b = result["best"]
        wm = close_node(wm, node_id, Attachment(
            attempt_id=b["id"], source_hash=b["source_hash"], status=b["status"],
            score=b["score"], latency_us=b["latency_us"],
        ))
        if best is None or b["score"] > best["score"] * (1 + ctx.config.noise_margin):
            best = best_entry(b, node_id)
            say(NewBestEvent(attempt_id=b["id"], score=b["score"], latency_us=b["latency_us"]))
        ask = lambda errs, wm=wm, ev=evidence: ctx.planner.after_cycle(ctx.task, wm, ev, errors=errs,
                                                                        sol=ctx.speed_of_light())
        reason = f"update after {cycle_id}"
    else:
        ask = lambda errs, wm=wm, ev=evidence: ctx.planner.too_hard(ctx.task, wm, ev, errors=errs,
                                                                     sol=ctx.speed_of_light())
        reason = f"too-hard update after {cycle_id}"
    try:
        new_wm, errors = edit_with_retries(
            ctx, f"update:{cycle_id}", ask, lambda s, wm=wm: apply_edits(wm, s, reflect_on=node_id)
        )
    except BudgetSpent as spent:  # the visit and the close stand; the planner is not asked
        new_wm, errors, reason = wm, [], f"{reason} without the planner ({spent})"
    if new_wm is None:
        say(EditRejectedEvent(cycle_id=cycle_id, errors=errors))
        new_wm = ensure_continuation(wm, node_id) if passed else wm
    if runtime is not None:
        ctx.store.snapshot_world_model(new_wm.to_state(), iteration=iterations, reason=reason)
        say(WorldModelEvent(phase=reason, nodes=len(new_wm.nodes), frontier=len(new_wm.frontier())))
    return new_wm, best


def _evidence(ctx: SearchContext, wm: WorldModel, result: dict) -> Evidence:
    node_id = result["node_id"]
    base = wm.code_parent(node_id).attachment
    rows = [ctx.store.get_attempt(a["id"]) for a in ctx.store.cycle_attempts(result["cycle_id"])]
    attempts = [{**attempt_summary(r), "log": r["log_excerpt"]} for r in rows if r is not None]
    failed = [r for r in rows if r is not None and r["status"] != "passed"]
    last_failed = failed[-1] if failed else None
    best = result["best"]
    return Evidence(
        node_id=node_id,
        cycle_id=result["cycle_id"],
        passed=best is not None,
        attempts=attempts,
        best=best,
        best_files=ctx.store.get_source(best["source_hash"]) if best else None,
        parent_score=base.score if base else None,
        last_log=last_failed["log_excerpt"] if last_failed else "",
        stop=result["stop"],
        best_result=_result(ctx, best["id"]) if best else None,
        parent_result=_result(ctx, base.attempt_id) if base else None,
        last_failed_id=last_failed["id"] if last_failed else None,
        last_failed_files=ctx.store.get_source(last_failed["source_hash"]) if last_failed and
        last_failed["source_hash"] else None,
    )


def _result(ctx: SearchContext, attempt_id: str) -> EvalResult | None:
    row = ctx.store.get_attempt(attempt_id)
    return EvalResult.model_validate_json(row["result"]) if row and row["result"] else None
