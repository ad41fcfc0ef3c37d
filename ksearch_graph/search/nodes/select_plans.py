"""Plan selection: pick up to k frontier actions and launch one action cycle for each.

The budget left (from the run's record, budget.py) is split over the launched cycles as their allowances; the
budget itself is enforced per attempt, so k cycles side by side never spend more iterations than the run has. The
launch payloads are written to state before the ``Send``s go out, which makes them part of the checkpoint: a resumed
or branched run relaunches exactly these cycles.
"""

from __future__ import annotations

from typing import Literal

from langgraph.runtime import Runtime
from langgraph.types import Send, interrupt
from pydantic import BaseModel, ValidationError

from ksearch_graph.search.budget import BudgetSpent
from ksearch_graph.search.context import SearchContext, search_context
from ksearch_graph.search.cycles import fresh_cycle_state, new_cycle
from ksearch_graph.search.events import CycleStartedEvent, EditRejectedEvent, StoppingEvent, WorldModelEvent
from ksearch_graph.search.merge import edit_with_retries
from ksearch_graph.search.policy import select_actions, weak_frontier
from ksearch_graph.search.rolling import start_round, waiting_lane
from ksearch_graph.search.state import SearchState
from ksearch_graph.search.streaming import emit
from ksearch_graph.search.world_model import Action, WorldModel
from ksearch_graph.search.world_model_edits import apply_edits
from ksearch_graph.tasks.evaluation import EvalResult


def select_plans(state: SearchState, runtime: Runtime[SearchContext]) -> dict:
    ctx = search_context(runtime)
    done = ctx.budget.iterations_done()  # the run's record, not the allowance a state was planned with
    stop = ctx.budget.stop_reason()
    wm = WorldModel.from_state(state["world_model"])
    picks: list[str] = []
    if stop is None:
        remaining = ctx.budget.iterations_left()
        lanes = min(ctx.config.parallel_cycles, remaining)
        wm = refill_if_weak(ctx, runtime, state, wm)
        stop = ctx.budget.cap_stop_reason()  # the refill's call may have reached a cap: no cycle starts then
        picks = [] if stop else select_actions(
            wm,
            lanes,
            policy=ctx.config.policy,
            difficulty_cap=ctx.config.difficulty_cap,
        )
        if stop is None and not picks:
            stop = "frontier exhausted: no open action left"
        elif ctx.config.approve_plans:
            picks, wm, stop = _approve(wm, picks)
    if stop is not None:
        emit(runtime, StoppingEvent(reason=stop))
        return {"stop_reason": stop, "selected": [], "world_model": wm.to_state(), "last_node": "select_plans"}

    # Rolling lanes: every lane gets its share of the budget, and the lanes without an action yet start waiting
    # for one (another lane's update adds actions); in rounds the picked cycles share the budget.
    lanes = lanes if rolling(ctx) else len(picks)
    seq = state.get("cycle_seq", 0)
    best_score = (state.get("best") or {}).get("score", 0.0)
    share, extra = divmod(remaining, lanes)
    cycles = []
    for i, node_id in enumerate(picks):
        seq += 1
        cycle = new_cycle(ctx, wm, node_id, seq, share + (1 if i < extra else 0), best_score, done)
        cycles.append(cycle)
        emit(runtime, CycleStartedEvent(cycle_id=cycle["id"], node_id=node_id,
                                        title=wm.nodes[node_id].action.title, allowance=cycle["allowance"]))
    waiting: list[dict] = []
    if rolling(ctx) and lanes > 1:
        waiting = [waiting_lane(cycles[0]["id"], i) for i in range(len(cycles) + 1, lanes + 1)]
        start_round(ctx, cycles, waiting, {**state, "world_model": wm.to_state(), "cycle_seq": seq})
    return {"selected": cycles + waiting, "cycle_seq": seq, "stop_reason": None, "world_model": wm.to_state(),
            "last_node": "select_plans"}


def refill_if_weak(ctx: SearchContext, runtime: Runtime[SearchContext], state: SearchState,
                   wm: WorldModel) -> WorldModel:
    """The reference's refill step: before a cycle starts on a weak frontier (no action valued above 0.5, or none),
    the planner adds actions. Its answer is cached under ``refill:c<next cycle>``, so a re-run reuses it; a planner
    without the step (offline) is not asked, and one whose edits are all rejected leaves the tree as it was."""
    ask = getattr(ctx.planner, "refill", None)
    if ask is None or not weak_frontier(wm):
        return wm
    cycle = f"c{state.get('cycle_seq', 0) + 1}"
    best = _best_result(ctx, state.get("best"))
    try:
        new_wm, errors = edit_with_retries(
            ctx, f"refill:{cycle}",
            lambda errs: ask(ctx.task, wm, errors=errs, sol=ctx.speed_of_light(), best=best),
            lambda script: apply_edits(wm, script),
        )
    except BudgetSpent:  # a cap reached before (another) planner call: the frontier stays as it is
        return wm
    if new_wm is None:
        emit(runtime, EditRejectedEvent(cycle_id=cycle, errors=errors))
        return wm
    ctx.store.snapshot_world_model(new_wm.to_state(), iteration=state.get("iterations_done", 0),
                                   reason=f"refill before {cycle}")
    emit(runtime, WorldModelEvent(phase=f"refill before {cycle}", nodes=len(new_wm.nodes),
                                  frontier=len(new_wm.frontier())))
    return new_wm


def _best_result(ctx: SearchContext, best: dict | None) -> tuple[str, EvalResult] | None:
    row = ctx.store.get_attempt(best["attempt_id"]) if best else None
    return (row["id"], EvalResult.model_validate_json(row["result"])) if row else None


def rolling(ctx: SearchContext) -> bool:
    """Cycles side by side merge into the world model as each ends and its lane starts the next one (no barrier),
    unless a person approves each plan."""
    return ctx.config.parallel_cycles > 1 and ctx.config.rolling_cycles and not ctx.config.approve_plans


class PlanDecision(BaseModel):
    """A person's answer to "implement this plan next?" (the resume value of the interrupt)."""

    decision: Literal["approve", "edit", "pick", "stop"]
    node_id: str | None = None  # with "pick": the frontier node to implement instead
    action: dict | None = None  # with "edit": Action fields to change (title, description, params, ...)


def _approve(wm: WorldModel, picks: list[str]) -> tuple[list[str], WorldModel, str | None]:
    """Ask a person about each selected plan with ``interrupt``: approve, edit it, pick another, or stop.

    On resume LangGraph re-runs this node and each ``interrupt`` returns its answer in order, so
    everything before an interrupt must be deterministic (it is: selection is). A malformed answer
    is asked again, with the error in the question.
    """
    approved: list[str] = []
    for node_id in picks:
        problem = ""
        while True:
            frontier = [{"id": n.id, "title": n.action.title, "value": n.action.value,
                         "difficulty": n.action.difficulty} for n in wm.frontier() if n.id not in approved]
            answer = interrupt({"question": "approve_plan", "node_id": node_id, "problem": problem,
                                "action": wm.nodes[node_id].action.model_dump(mode="json"), "frontier": frontier})
            try:
                d = PlanDecision.model_validate(answer)
                if d.decision == "stop":
                    return approved, wm, "stopped by the user"
                if d.decision == "pick":
                    if d.node_id not in {f["id"] for f in frontier}:
                        raise ValueError(f"{d.node_id!r} is not an open action on the frontier")
                    node_id = d.node_id
                elif d.decision == "edit":
                    edited = wm.nodes[node_id].action.model_dump() | (d.action or {})
                    wm = wm.model_copy(deep=True)
                    wm.nodes[node_id].action = Action.model_validate(edited)
            except (ValidationError, ValueError) as e:
                problem = f"the last answer was not usable: {e}"
                continue
            approved.append(node_id)
            break
    return approved, wm, None


def launch_cycles(state: SearchState):
    """Conditional edge after select_plans: one Send per selected cycle, or finish."""
    if state.get("stop_reason") or not state.get("selected"):
        return "finalize"
    # A cycle may carry ``resume``: its state after an earlier attempt (a branch at that attempt).
    return [
        Send("action_cycle", {**fresh_cycle_state(c), **c.get("resume", {})})
        for c in state["selected"]
    ]


