"""Next cycle (rolling lanes only): merge the cycle that just ended and start the lane's next one.

See ``rolling.py``. The merge is committed to the store before this node's checkpoint, and a re-run finds the
commit, so after a crash the lane continues with the same next cycle.
"""

from __future__ import annotations

from langgraph.graph import END
from langgraph.runtime import Runtime

from ..context import search_context
from ..rolling import live_round
from ..state import CycleState
from ..events import CycleStartedEvent, LaneFinishedEvent
from ._common import emit
from .select_plans import fresh_cycle_state


def next_cycle(state: CycleState, runtime: Runtime) -> dict:
    ctx = search_context(runtime)
    result = state["finished_cycles"][-1]
    record = live_round(ctx, state["cycle"]["round"]).merge_and_claim(ctx, runtime, result)
    nxt = record["next"]
    if nxt is None:
        emit(runtime, LaneFinishedEvent(cycle_id=result["cycle_id"], reason=record["lane_end"]))
        return {"stop": f"lane finished: {record['lane_end']}"}
    emit(runtime, CycleStartedEvent(cycle_id=nxt["id"], node_id=nxt["node_id"], title=nxt["action"]["title"],
                                    allowance=nxt["allowance"]))
    return fresh_cycle_state(nxt)


def after_next_cycle(state: CycleState) -> str:
    return END if state.get("stop") else "instantiate_code"
