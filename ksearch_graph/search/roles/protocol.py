"""The two roles the graph calls for judgement: a planner (edits the world model) and a coder.

There are two real implementations of each: the LLM ones (``llm_agents.py``) and the offline,
no-LLM baseline (``offline.py``). The graph only sees these protocols.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ksearch_graph.search.world_model import WorldModel
from ksearch_graph.search.world_model_edits import EditScript
from ksearch_graph.tasks.task import Task

if TYPE_CHECKING:
    from ksearch_graph.tasks.evaluation import EvalResult
    from ksearch_graph.tasks.speed_of_light import SpeedOfLight

PromptKind = Literal["first", "debug", "improve"]


@dataclass
class Usage:
    """What one planner/coder call cost. Stored in the run's ledger."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    seconds: float = 0.0
    cached_prompt_tokens: int = 0  # of prompt_tokens, read from the provider's prompt cache
    # Every request of the call and its raw answer, repairs included: {"messages": [{"role", "content"}], "answer"}.
    # Recorded in the run directory (store.record_exchanges), not in the ledger.
    transcript: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost_usd": self.cost_usd,
            "seconds": self.seconds,
            "cached_prompt_tokens": self.cached_prompt_tokens,
        }


@dataclass
class Evidence:
    """What a finished cycle taught us, for the world-model update."""

    node_id: str
    cycle_id: str
    passed: bool
    attempts: list[dict]  # summaries, oldest first
    best: dict | None  # best passing attempt summary
    best_files: dict[str, str] | None
    parent_score: float | None  # the base's score (None when the base is the bare spec)
    last_log: str  # log excerpt of the last failed attempt, if any
    stop: str
    best_result: EvalResult | None = None  # the best attempt's full evaluation (per-workload latencies)
    parent_result: EvalResult | None = None  # the base's, to compare per workload
    last_failed_id: str | None = None
    last_failed_files: dict[str, str] | None = None  # the code of the last failed attempt (the too-hard update)


@dataclass
class CodeRequest:
    kind: PromptKind
    task: Task
    node_id: str
    action: dict  # Action.model_dump()
    attempt_id: str
    base_files: dict[str, str] | None  # code the action applies to (parent's or cycle-best); None = from spec
    base_summary: dict | None
    last_files: dict[str, str] | None  # previous attempt of this cycle
    last_summary: dict | None
    feedback: str  # the reflection's text for this attempt: failure log or performance summary
    history: list[dict] = field(default_factory=list)  # this cycle's attempt summaries, each with its "log"
    history_files: list[dict[str, str]] = field(default_factory=list)  # their code, same order
    analysis: str = ""  # the planner's analysis of the task
    sol: SpeedOfLight | None = None  # the run's GPU and the workloads' floors
    # the code the cycle started from (first and debug: base_files; improve: base_files is the cycle's best)
    start_files: dict[str, str] | None = None
    start_summary: dict | None = None


@dataclass
class CodeAnswer:
    files: dict[str, str]  # empty when no code could be extracted (then ``error`` says why)
    usage: Usage
    error: str = ""


class Planner(Protocol):
    """``sol``: the run's GPU and the workloads' floors (None: not known). A planner may also define
    ``refill(task, wm, *, errors, sol, best)``, asked at a cycle's start when the frontier is weak (select_plans.py);
    one without it (the offline planner, whose template walk proposes every move itself) is not asked."""

    def initial(self, task: Task, wm: WorldModel, *, errors: list[str],
                sol: SpeedOfLight | None = None) -> tuple[EditScript, Usage]: ...

    def after_cycle(
        self, task: Task, wm: WorldModel, evidence: Evidence, *, errors: list[str], sol: SpeedOfLight | None = None
    ) -> tuple[EditScript, Usage]: ...

    def too_hard(
        self, task: Task, wm: WorldModel, evidence: Evidence, *, errors: list[str], sol: SpeedOfLight | None = None
    ) -> tuple[EditScript, Usage]: ...


class Coder(Protocol):
    def write(self, request: CodeRequest) -> CodeAnswer: ...


class PlannerOutputError(ValueError):
    """The planner's answer could not be turned into an EditScript (fed back like a rejected edit)."""

    def __init__(self, errors: list[str], usage: Usage):
        super().__init__("; ".join(errors))
        self.errors = errors
        self.usage = usage
