"""Graph state: small and JSON-native, because the checkpointer stores a full copy at every step.

Code, logs and evaluation details live in the run store and are referenced here by id / hash.

``SearchState`` is the main graph's state; ``CycleState`` is the state of one action cycle (the
subgraph started with ``Send``). The two share exactly one key, ``finished_cycles``: a cycle's final
node writes its result there, and the parent collects the results of all cycles of a round.
"""

from __future__ import annotations

from typing import Annotated, TypedDict

CLEAR = {"clear": True}


def latest(current: str | None, update: str | None) -> str | None:
    """Reducer for values that parallel cycles may write in the same step (the last one wins)."""
    return update if update is not None else current


def collect_cycles(current: list[dict] | None, update: list[dict] | dict | None) -> list[dict]:
    """Reducer: cycles append their results; the world-model update clears them once merged."""
    if update == CLEAR:
        return []
    return (current or []) + list(update or [])


class SearchState(TypedDict, total=False):
    world_model: dict  # WorldModel.to_state()
    iterations_done: int  # evaluated attempts merged into the search so far
    cycle_seq: int  # how many cycles were ever launched (cycle ids are c1, c2, ...)
    selected: list[dict]  # the cycles select_plans launched this round (their Send payloads)
    finished_cycles: Annotated[list[dict], collect_cycles]
    merged_cycles: list[str]  # ids of cycles whose attempts belong to this state's history
    best: dict | None  # {attempt_id, score, latency_us, node_id, source_hash}
    stop_reason: str | None
    last_node: Annotated[str, latest]  # the node that wrote this checkpoint (branching re-enters after it)


class CycleState(TypedDict, total=False):
    # Fixed for the cycle's life: {id, node_id, allowance, base_attempt_id, base_source_hash,
    # best_score_at_start, iteration_base}
    cycle: dict
    # Only the last and the best attempt live in state (the store has them all): a long cycle must
    # not make every checkpoint longer.
    n_attempts: int
    steps: int  # code-generation steps (each makes `samples` attempts; equal to n_attempts with one sample)
    last: dict | None  # summary of the latest evaluated attempt
    pending: dict | None  # a generated, not yet evaluated attempt: {id, prompt_kind, source_hash, ...}
    pending_samples: list[dict] | None  # with samples > 1: every sample of the step (pending is the first)
    cycle_best: dict | None  # best passing attempt summary of this cycle
    stagnation: int  # consecutive non-improving attempts
    feedback: str  # the reflection's words for the next attempt (failure log or performance summary)
    stop: str | None  # why the cycle ended
    halt: str | None  # a budget stopped the cycle before its next attempt (budget.py); reflect closes it
    finished_cycles: Annotated[list[dict], collect_cycles]
    last_node: Annotated[str, latest]  # set to "action_cycle" when the cycle closes
