"""The progress events a search streams (LangGraph's custom stream mode; also kept in the store's event log).

A node emits one of the classes below (``nodes/_common.emit``). On the stream every event is a JSON object
with ``event`` naming its kind and the class's fields beside it; the store logs the fields under the kind.
The CLI's live view (``progress.py``) and server clients (``stream_mode="custom"``) read the same objects.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar


@dataclass(frozen=True)
class Event:
    kind: ClassVar[str]

    def fields(self) -> dict[str, Any]:
        return asdict(self)

    def as_message(self) -> dict[str, Any]:
        """The object on the stream: ``{"event": kind, **fields}``."""
        return {"event": self.kind, **self.fields()}


@dataclass(frozen=True)
class CodegenEvent(Event):
    kind: ClassVar[str] = "codegen"  # the coder is asked for an attempt's code
    cycle_id: str
    attempt_id: str
    prompt_kind: str  # first | debug | improve


@dataclass(frozen=True)
class AttemptEvent(Event):
    kind: ClassVar[str] = "attempt"  # one iteration (codegen + evaluation) finished
    attempt_id: str
    cycle_id: str
    node_id: str
    iteration: int  # 0 for the seed solution
    prompt_kind: str  # seed | first | debug | improve
    status: str  # passed | compile_error | runtime_error | timeout | incorrect_* | suspicious | unavailable
    score: float
    latency_us: float | None
    log: str  # the first 200 characters of the log excerpt
    best_score: float  # the best score known to this cycle after this attempt
    tokens: int  # LLM tokens spent by the whole run so far
    floor_fraction: float | None = None  # of the speed-of-light floor (GPU timings only; speed_of_light.py)
    implausible: bool = False  # measured faster than the floor on some workload


@dataclass(frozen=True)
class InfrastructureEvent(Event):
    kind: ClassVar[str] = "infrastructure"  # an evaluation failed outside the candidate: not its attempt, retried
    attempt_id: str
    reason: str  # what failed (EvalResult.infrastructure)
    slot: str | None  # the pool slot or Ray node it ran on, where known
    try_number: int  # 1 for the first evaluation of this attempt
    tries: int  # how many it gets before the control decides (infrastructure.py)


@dataclass(frozen=True)
class CycleStartedEvent(Event):
    kind: ClassVar[str] = "cycle_started"
    cycle_id: str
    node_id: str
    title: str
    allowance: int  # at most this many iterations


@dataclass(frozen=True)
class CycleFinishedEvent(Event):
    kind: ClassVar[str] = "cycle_finished"
    cycle_id: str
    node_id: str
    passed: bool
    best_attempt: str | None
    attempts: int
    reason: str


@dataclass(frozen=True)
class CycleOrphanedEvent(Event):
    kind: ClassVar[str] = "cycle_orphaned"  # the cycle's node was pruned meanwhile: its evidence is kept only
    cycle_id: str
    node_id: str


@dataclass(frozen=True)
class LaneWaitingEvent(Event):
    kind: ClassVar[str] = "lane_waiting"  # a rolling lane found no free action: it waits for another lane's merge
    cycle_id: str


@dataclass(frozen=True)
class LaneFinishedEvent(Event):
    kind: ClassVar[str] = "lane_finished"  # a rolling lane ended: budget spent, a cap, or nothing left to do
    cycle_id: str
    reason: str


@dataclass(frozen=True)
class WorldModelEvent(Event):
    kind: ClassVar[str] = "world_model"  # after initialisation and every update
    phase: str
    nodes: int
    frontier: int


@dataclass(frozen=True)
class NewBestEvent(Event):
    kind: ClassVar[str] = "new_best"
    attempt_id: str
    score: float
    latency_us: float | None


@dataclass(frozen=True)
class EditRejectedEvent(Event):
    kind: ClassVar[str] = "edit_rejected"  # the planner's update after a cycle stayed invalid after retries
    cycle_id: str
    errors: list[str]


@dataclass(frozen=True)
class PlannerFailedEvent(Event):
    kind: ClassVar[str] = "planner_failed"  # no valid initial world model after retries: the run pauses
    phase: str
    errors: list[str]


@dataclass(frozen=True)
class StoppingEvent(Event):
    kind: ClassVar[str] = "stopping"
    reason: str


@dataclass(frozen=True)
class FinishedEvent(Event):
    kind: ClassVar[str] = "finished"
    reason: str | None
    best: dict | None  # the run's best entry (attempt_id, score, latency_us, node_id, source_hash)
    iterations: int
