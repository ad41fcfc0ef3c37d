"""A new action cycle: its id, its launch record and the cycle subgraph's fresh state."""

from __future__ import annotations

from ksearch_graph.search.context import SearchContext
from ksearch_graph.search.state import Cycle, CycleState
from ksearch_graph.search.world_model import WorldModel


def new_cycle(ctx: SearchContext, wm: WorldModel, node_id: str, seq: int, allowance: int, best_score: float,
              done: int) -> Cycle:
    """A cycle's launch payload (fixed for its life)."""
    base = wm.code_parent(node_id).attachment
    return {
        "id": _fresh_cycle_id(ctx, seq),
        "node_id": node_id,
        "action": wm.nodes[node_id].action.model_dump(mode="json"),
        "allowance": allowance,
        "base_attempt_id": base.attempt_id if base else None,
        "base_source_hash": base.source_hash if base else None,
        "base_score": base.score if base else None,
        "best_score_at_start": best_score,
        "iteration_base": done,
    }


def _fresh_cycle_id(ctx: SearchContext, seq: int) -> str:
    """``c<seq>``, unless another history of this run (a fork of the same thread on a server, where
    branches share one store) already used it: then ``c<seq>b``, ``c<seq>c``, ... Attempts are
    recorded under their cycle's id, so ids must not be shared between histories."""
    cycle_id, suffix = f"c{seq}", ord("a")
    while ctx.store.has_cycle(cycle_id):
        suffix += 1
        cycle_id = f"c{seq}{chr(suffix)}"
    return cycle_id


def fresh_cycle_state(cycle: Cycle) -> CycleState:
    return {"cycle": cycle, "n_attempts": 0, "steps": 0, "last": None, "pending": None, "pending_samples": None,
            "cycle_best": None, "stagnation": 0, "stop": None, "feedback": ""}
