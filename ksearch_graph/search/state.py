"""Graph state: small and JSON-native, because the checkpointer stores a full copy at every step.

Code, logs and evaluation details live in the run store and are referenced here by id / hash.

``SearchState`` is the main graph's state; ``CycleState`` is the state of one action cycle (the
subgraph started with ``Send``). The two share exactly one key, ``finished_cycles``: a cycle's final
node writes its result there, and the parent collects the results of all cycles of a round.
"""

from __future__ import annotations

from typing import Annotated, Any, NotRequired, TypedDict

CLEAR = {"clear": True}


# ------------------------------------------------------------------ payloads (JSON objects inside the state)


class AttemptSummary(TypedDict):
    """What state keeps of an evaluated attempt (the store has the rest): ``store.attempt_summary``."""

    id: str
    status: str
    score: float
    latency_us: float | None
    prompt_kind: str
    source_hash: str | None


class BestEntry(TypedDict):
    """The search's best passing attempt so far: ``merge.best_entry``."""

    attempt_id: str
    score: float
    latency_us: float | None
    node_id: str  # the world-model node whose cycle made it
    source_hash: str | None


class Cycle(TypedDict):
    """A cycle's launch payload, fixed for its life: ``cycles.new_cycle``. A rolling lane launched without an action
    is only ``{"id", "waiting": True}`` (``rolling.waiting_lane``)."""

    id: str
    node_id: str
    action: dict[str, Any]  # the world model's Action, as JSON
    allowance: int  # attempts this cycle may make
    base_attempt_id: str | None  # the code the cycle starts from
    base_source_hash: str | None
    base_score: float | None
    best_score_at_start: float
    iteration_base: int  # iterations done when it was launched
    round: NotRequired[str]  # the rolling round it belongs to
    waiting: NotRequired[bool]
    resume: NotRequired[dict[str, Any]]  # a branch at an attempt: the cycle's state right after it


class PendingAttempt(TypedDict):
    """Generated code not yet evaluated: ``instantiate_code``'s output, ``compile_and_bench``'s input."""

    id: str
    prompt_kind: str  # first, debug or improve
    base_attempt_id: str | None
    parent_attempt_id: str | None
    source_hash: str | None  # None: the coder gave no code (``error`` says why)
    error: str | None
    prompt_tokens: int
    completion_tokens: int
    codegen_s: float


class CycleResult(TypedDict):
    """What a finished cycle hands the main graph (``reflect``), merged into the world model by the update."""

    cycle_id: str
    node_id: str
    best: AttemptSummary | None
    n_attempts: int
    stop: str


# ------------------------------------------------------------------ reducers


def latest(current: str | None, update: str | None) -> str | None:
    """Reducer for values that parallel cycles may write in the same step (the last one wins)."""
    return update if update is not None else current


def collect_cycles(current: list[CycleResult] | None,
                   update: list[CycleResult] | dict | None) -> list[CycleResult]:
    """Reducer: cycles append their results; the world-model update clears them once merged."""
    if update == CLEAR:
        return []
    return (current or []) + list(update or [])


class SearchState(TypedDict, total=False):
    world_model: dict  # WorldModel.to_state()
    iterations_done: int  # evaluated attempts merged into the search so far
    cycle_seq: int  # how many cycles were ever launched (cycle ids are c1, c2, ...)
    selected: list[Cycle]  # the cycles select_plans launched this round (their Send payloads)
    finished_cycles: Annotated[list[CycleResult], collect_cycles]
    merged_cycles: list[str]  # ids of cycles whose attempts belong to this state's history
    best: BestEntry | None
    stop_reason: str | None
    last_node: Annotated[str, latest]  # the node that wrote this checkpoint (branching re-enters after it)


class CycleState(TypedDict, total=False):
    cycle: Cycle
    # Only the last and the best attempt live in state (the store has them all): a long cycle must
    # not make every checkpoint longer.
    n_attempts: int
    steps: int  # code-generation steps (each makes `samples` attempts; equal to n_attempts with one sample)
    last: AttemptSummary | None  # the latest evaluated attempt
    pending: PendingAttempt | None  # generated, not yet evaluated
    pending_samples: list[PendingAttempt] | None  # with samples > 1: every sample of the step (pending is the first)
    cycle_best: AttemptSummary | None  # best passing attempt of this cycle
    stagnation: int  # consecutive non-improving attempts
    feedback: str  # the reflection's words for the next attempt (failure log or performance summary)
    stop: str | None  # why the cycle ended
    halt: str | None  # a budget stopped the cycle before its next attempt (budget.py); reflect closes it
    finished_cycles: Annotated[list[CycleResult], collect_cycles]
    last_node: Annotated[str, latest]  # set to "action_cycle" when the cycle closes
