"""Next cycle (rolling lanes only): merge the cycle that just ended and start the lane's next one.

See ``rolling.py``. The merge is committed to the store before this node's checkpoint, and a re-run finds the
commit, so after a crash the lane continues with the same next cycle. A lane with no free action waits here for
another lane's merge to hand it one (or to end it); a lane launched without an action starts here, waiting.
"""

from __future__ import annotations

from langgraph.graph import END
from langgraph.runtime import Runtime

from ksearch_graph.search.context import search_context
from ksearch_graph.search.cycles import fresh_cycle_state
from ksearch_graph.search.events import CycleStartedEvent, LaneFinishedEvent, LaneWaitingEvent
from ksearch_graph.search.rolling import live_round
from ksearch_graph.search.state import CycleState
from ksearch_graph.search.streaming import emit


def next_cycle(state: CycleState, runtime: Runtime) -> dict:
    ctx = search_context(runtime)
    lane = live_round(ctx, state["cycle"]["round"])
    if state["cycle"].get("waiting"):  # launched without an action
        lane_id = state["cycle"]["id"]
        outcome = lane.wait_for_handoff(lane_id)
    else:
        result = state["finished_cycles"][-1]
        lane_id = result["cycle_id"]
        outcome = lane.merge_and_claim(ctx, runtime, result)
        if outcome.get("waits"):
            emit(runtime, LaneWaitingEvent(cycle_id=lane_id))
            outcome = lane.wait_for_handoff(lane_id)
    nxt = outcome["next"]
    if nxt is None:
        emit(runtime, LaneFinishedEvent(cycle_id=lane_id, reason=outcome["lane_end"]))
        return {"stop": f"lane finished: {outcome['lane_end']}"}
    emit(runtime, CycleStartedEvent(cycle_id=nxt["id"], node_id=nxt["node_id"], title=nxt["action"]["title"],
                                    allowance=nxt["allowance"]))
    return fresh_cycle_state(nxt)


def after_next_cycle(state: CycleState) -> str:
    return END if state.get("stop") else "instantiate_code"


def lane_start(state: CycleState) -> str:
    """A lane launched with an action implements it; one launched without waits for a hand-off."""
    return "next_cycle" if state["cycle"].get("waiting") else "instantiate_code"
