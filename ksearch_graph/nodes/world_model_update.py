"""World-model update: initialisation, the update after each cycle, and the too-hard update.

The planner proposes an edit script; it is applied atomically (``world_model.apply_edits``). A rejected
script's errors go back to the planner for a bounded number of retries. Each planner answer is cached
in the store under a deterministic key, so a node re-run after a crash does not pay for it twice.
"""

from __future__ import annotations

from typing import Callable

from langgraph.runtime import Runtime

from ..agents import Evidence, PlannerOutputError, Usage
from ..context import SearchContext, search_context
from ..events import (CycleOrphanedEvent, EditRejectedEvent, NewBestEvent, PlannerFailedEvent,
                      WorldModelEvent)
from ..state import CLEAR, SearchState
from ..world_model import (
    MAX_INIT_NODES,
    ROOT,
    Attachment,
    EditRejected,
    EditScript,
    WorldModel,
    apply_edits,
    close_node,
    ensure_continuation,
    record_visit,
)
from ._common import emit
from .compile_and_bench import evaluate_once


class PlannerFailed(RuntimeError):
    """The planner produced no acceptable initial world model; the run pauses and can be resumed."""


def _edit_with_retries(
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
            try:
                script, usage = ask(errors)
                cached = {"script": script.model_dump(mode="json")}
            except PlannerOutputError as e:
                usage, cached = e.usage, {"errors": e.errors}
            ctx.store.record_llm_call("planner", key.split(":")[0], usage.as_dict(), usage.seconds)
            ctx.store.put_generation(cache_key, cached)
        if "errors" in cached:
            errors = cached["errors"]
            continue
        try:
            return apply(EditScript.model_validate(cached["script"])), []
        except EditRejected as e:
            errors = e.errors
    return None, errors


def init_world_model(state: SearchState, runtime: Runtime[SearchContext]) -> dict:
    ctx = search_context(runtime)
    wm = WorldModel.new(ctx.task.spec.description or ctx.task.name)
    best = None
    merged: list[str] = []
    if ctx.task.seed_source is not None:
        # The seed is measured once, like any attempt, and attached to the root as the starting code.
        row = evaluate_once(ctx, runtime, attempt_id="seed", cycle_id="seed", node_id=ROOT, prompt_kind="seed",
                            files={ctx.task.spec.solution_file: ctx.task.seed_source})
        merged.append("seed")
        if row["status"] == "passed":
            wm.nodes[ROOT].attachment = Attachment(
                attempt_id="seed", source_hash=row["source_hash"], status="passed",
                score=row["score"], latency_us=row["latency_us"],
            )
            best = _best_entry(row, ROOT)
    new_wm, errors = _edit_with_retries(
        ctx,
        "init",
        lambda errs: ctx.planner.initial(ctx.task, wm, errors=errs),
        lambda script: _checked_init(wm, script),
    )
    if new_wm is None:
        emit(runtime, PlannerFailedEvent(phase="init", errors=errors))
        raise PlannerFailed("the planner gave no valid initial world model:\n  " + "\n  ".join(errors))
    ctx.store.snapshot_world_model(new_wm.to_state(), iteration=0, reason="init")
    emit(runtime, WorldModelEvent(phase="init", nodes=len(new_wm.nodes), frontier=len(new_wm.frontier())))
    return {
        "world_model": new_wm.to_state(),
        "iterations_done": 0,
        "cycle_seq": 0,
        "merged_cycles": merged,
        "best": best,
        "stop_reason": None,
        "last_node": "init_world_model",
    }


def _checked_init(wm: WorldModel, script: EditScript) -> WorldModel:
    new = apply_edits(wm, script, max_new_nodes=MAX_INIT_NODES)
    if not new.frontier():
        raise EditRejected(["the initial world model has no open action; insert at least 3 under 'root'"])
    return new


def _best_entry(row: dict, node_id: str) -> dict:
    return {
        "attempt_id": row["id"],
        "score": row["score"],
        "latency_us": row["latency_us"],
        "node_id": node_id,
        "source_hash": row["source_hash"],
    }


def update_world_model(state: SearchState, runtime: Runtime[SearchContext]) -> dict:
    ctx = search_context(runtime)
    selected = state.get("selected", [])
    if selected and selected[0].get("round"):  # rolling cycles merged themselves as they ended
        from ..rolling import round_state

        return {**round_state(ctx, selected[0]["round"]), "finished_cycles": CLEAR, "selected": [],
                "last_node": "update_world_model"}
    wm = WorldModel.from_state(state["world_model"])
    best = state.get("best")
    iterations = state.get("iterations_done", 0)
    merged = list(state.get("merged_cycles", []))
    # In launch order, so parallel cycles merge deterministically.
    order = {c["id"]: i for i, c in enumerate(selected)}
    for result in sorted(state.get("finished_cycles", []), key=lambda r: order.get(r["cycle_id"], len(order))):
        iterations += result["n_attempts"]
        merged.append(result["cycle_id"])
        wm, best = merge_cycle(ctx, runtime, wm, best, result, iterations=iterations)
    return {
        "world_model": wm.to_state(),
        "finished_cycles": CLEAR,
        "selected": [],
        "iterations_done": iterations,
        "merged_cycles": merged,
        "best": best,
        "last_node": "update_world_model",
    }


def merge_cycle(ctx: SearchContext, runtime: Runtime[SearchContext] | None, wm: WorldModel, best: dict | None,
                result: dict, *, iterations: int) -> tuple[WorldModel, dict | None]:
    """One finished cycle into the world model: visit, close on success, the planner's (cached) edit.
    ``runtime`` None: quiet (no events, no snapshot), to get the planner's answer into the cache ahead."""
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
            best = _best_entry(b, node_id)
            say(NewBestEvent(attempt_id=b["id"], score=b["score"], latency_us=b["latency_us"]))
        ask = lambda errs, wm=wm, ev=evidence: ctx.planner.after_cycle(ctx.task, wm, ev, errors=errs)
        reason = f"update after {cycle_id}"
    else:
        ask = lambda errs, wm=wm, ev=evidence: ctx.planner.too_hard(ctx.task, wm, ev, errors=errs)
        reason = f"too-hard update after {cycle_id}"
    new_wm, errors = _edit_with_retries(
        ctx, f"update:{cycle_id}", ask, lambda s, wm=wm: apply_edits(wm, s, reflect_on=node_id)
    )
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
    attempts = ctx.store.cycle_attempts(result["cycle_id"])
    failed = [a for a in attempts if a["status"] != "passed"]
    last_log = ""
    if failed:
        row = ctx.store.get_attempt(failed[-1]["id"])
        last_log = row["log_excerpt"] if row else ""
    best = result["best"]
    return Evidence(
        node_id=node_id,
        cycle_id=result["cycle_id"],
        passed=best is not None,
        attempts=attempts,
        best=best,
        best_files=ctx.store.get_source(best["source_hash"]) if best else None,
        parent_score=base.score if base else None,
        last_log=last_log,
        stop=result["stop"],
    )
