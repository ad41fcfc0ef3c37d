"""Plan selection: pick up to k frontier actions and launch one action cycle for each.

The budget left is split over the launched cycles, so k cycles side by side never spend more
iterations than the run has. The launch payloads are written to state before the ``Send``s go out,
which makes them part of the checkpoint: a resumed or branched run relaunches exactly these cycles.
"""

from __future__ import annotations

from langgraph.runtime import Runtime
from langgraph.types import Send

from ..context import SearchContext
from ..policy import select_actions
from ..state import SearchState
from ..world_model import WorldModel
from ._common import emit


def select_plans(state: SearchState, runtime: Runtime[SearchContext]) -> dict:
    ctx = runtime.context
    done = state.get("iterations_done", 0)
    stop = ctx.budget_stop_reason(done)
    wm = WorldModel.from_state(state["world_model"])
    picks: list[str] = []
    if stop is None:
        remaining = ctx.config.budget.iterations - done
        picks = select_actions(
            wm,
            min(ctx.config.parallel_cycles, remaining),
            policy=ctx.config.policy,
            difficulty_cap=ctx.config.difficulty_cap,
        )
        if not picks:
            stop = "frontier exhausted: no open action left"
    if stop is not None:
        emit(runtime, "stopping", reason=stop)
        return {"stop_reason": stop, "selected": [], "last_node": "select_plans"}

    seq = state.get("cycle_seq", 0)
    best_score = (state.get("best") or {}).get("score", 0.0)
    share, extra = divmod(remaining, len(picks))
    cycles = []
    for i, node_id in enumerate(picks):
        seq += 1
        base = wm.code_parent(node_id).attachment
        cycle = {
            "id": f"c{seq}",
            "node_id": node_id,
            "action": wm.nodes[node_id].action.model_dump(mode="json"),
            "allowance": share + (1 if i < extra else 0),
            "base_attempt_id": base.attempt_id if base else None,
            "base_source_hash": base.source_hash if base else None,
            "base_score": base.score if base else None,
            "best_score_at_start": best_score,
            "iteration_base": done,
        }
        cycles.append(cycle)
        emit(runtime, "cycle_started", cycle_id=cycle["id"], node_id=node_id,
             title=wm.nodes[node_id].action.title, allowance=cycle["allowance"])
    return {"selected": cycles, "cycle_seq": seq, "stop_reason": None, "last_node": "select_plans"}


def launch_cycles(state: SearchState):
    """Conditional edge after select_plans: one Send per selected cycle, or finish."""
    if state.get("stop_reason") or not state.get("selected"):
        return "finalize"
    return [
        Send("action_cycle", {"cycle": c, "n_attempts": 0, "last": None, "pending": None, "cycle_best": None,
                              "stagnation": 0, "stop": None, "feedback": ""})
        for c in state["selected"]
    ]
