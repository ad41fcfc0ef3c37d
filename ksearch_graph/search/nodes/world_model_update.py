"""World-model update: initialisation, the update after each cycle, and the too-hard update.

The planner proposes an edit script; it is applied atomically (``world_model_edits.apply_edits``). A rejected
script's errors go back to the planner for a bounded number of retries. Each planner answer is cached
in the store under a deterministic key, so a node re-run after a crash does not pay for it twice.
"""

from __future__ import annotations

from langgraph.runtime import Runtime

from ksearch_graph.search.budget import BudgetSpent
from ksearch_graph.search.context import SearchContext, search_context
from ksearch_graph.search.events import PlannerFailedEvent, WorldModelEvent
from ksearch_graph.search.merge import best_entry, edit_with_retries, merge_cycle
from ksearch_graph.search.nodes.compile_and_bench import evaluate_once
from ksearch_graph.search.rolling import round_state
from ksearch_graph.search.state import CLEAR, SearchState
from ksearch_graph.search.streaming import emit
from ksearch_graph.search.world_model import MAX_INIT_NODES, ROOT, Attachment, WorldModel
from ksearch_graph.search.world_model_edits import EditRejected, EditScript, apply_edits


class PlannerFailed(RuntimeError):
    """The planner produced no acceptable initial world model; the run pauses and can be resumed."""


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
            best = best_entry(row, ROOT)
    try:
        new_wm, errors = edit_with_retries(
            ctx,
            "init",
            lambda errs: ctx.planner.initial(ctx.task, wm, errors=errs, sol=ctx.speed_of_light()),
            lambda script: _checked_init(wm, script),
        )
    except BudgetSpent:  # a cap reached before the planner's first answer: no actions, select_plans stops
        new_wm, errors = wm, []
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


def update_world_model(state: SearchState, runtime: Runtime[SearchContext]) -> dict:
    ctx = search_context(runtime)
    selected = state.get("selected", [])
    if selected and selected[0].get("round"):  # rolling cycles merged themselves as they ended
        return {**round_state(ctx, selected[0]["round"]), "finished_cycles": CLEAR, "selected": [],
                "last_node": "update_world_model"}
    wm = WorldModel.from_state(state["world_model"])
    best = state.get("best")
    iterations = state.get("iterations_done", 0)
    merged = list(state.get("merged_cycles", []))
    # In launch order, so parallel cycles merge deterministically.
    order = {c["id"]: i for i, c in enumerate(selected)}
    for result in sorted(state.get("finished_cycles", []), key=lambda r: order.get(r["cycle_id"], len(order))):
        if result["n_attempts"] == 0:  # halted by a budget before its first attempt: nothing to merge
            continue
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


