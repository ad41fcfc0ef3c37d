"""The progress events a search streams (LangGraph's custom stream mode; also kept in the store's event log).

Every event is a JSON object with ``event`` naming its kind; the fields of each kind are below. The CLI's
live view (``progress.py``) and server clients (``stream_mode="custom"``) read the same events.
"""

from __future__ import annotations

from typing import TypedDict


class AttemptEvent(TypedDict):
    event: str  # "attempt": one iteration (codegen + evaluation) finished
    attempt_id: str
    cycle_id: str
    node_id: str
    iteration: int  # 0 for the seed solution
    prompt_kind: str  # seed | first | debug | improve
    status: str  # passed | compile_error | runtime_error | timeout | incorrect_* | suspicious | unavailable
    score: float
    latency_us: float | None
    best_score: float  # the best score known to this cycle after this attempt
    tokens: int  # LLM tokens spent by the whole run so far
    log: str  # the first 200 characters of the log excerpt


class CycleStartedEvent(TypedDict):
    event: str  # "cycle_started"
    cycle_id: str
    node_id: str
    title: str
    allowance: int  # at most this many iterations


class CycleFinishedEvent(TypedDict):
    event: str  # "cycle_finished"
    cycle_id: str
    node_id: str
    passed: bool
    best_attempt: str | None
    attempts: int
    reason: str


class WorldModelEvent(TypedDict):
    event: str  # "world_model": after initialisation and every update
    phase: str
    nodes: int
    frontier: int


class NewBestEvent(TypedDict):
    event: str  # "new_best"
    attempt_id: str
    score: float
    latency_us: float | None


# Also: "codegen" {cycle_id, attempt_id, prompt_kind}; "stopping" {reason}; "finished" {reason, best, iterations};
# "edit_rejected" / "planner_failed" {errors, ...}; "cycle_orphaned" {cycle_id, node_id}.
