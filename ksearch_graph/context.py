"""What every node can reach besides its state: the run's task, settings, store and tools.

Passed to the graph as LangGraph's runtime context (``graph.stream(..., context=ctx)``), so it is
never checkpointed: on resume the CLI rebuilds it from the run directory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .agents import Coder, Planner
from .config import SearchConfig
from .evaluation import Evaluator
from .store import RunStore
from .task import Task


@dataclass
class SearchContext:
    task: Task
    config: SearchConfig
    store: RunStore
    evaluator: Evaluator
    planner: Planner
    coder: Coder
    run_dir: Path

    def budget_stop_reason(self, iterations_done: int) -> str | None:
        """Why the search must stop now, or None. Token, cost and time caps are global to the run."""
        budget = self.config.budget
        if iterations_done >= budget.iterations:
            return f"iteration budget spent ({iterations_done}/{budget.iterations})"
        return self.cap_stop_reason()

    def cap_stop_reason(self) -> str | None:
        budget = self.config.budget
        if budget.max_tokens is not None or budget.max_cost_usd is not None:
            totals = self.store.token_totals()
            if budget.max_tokens is not None and totals["total_tokens"] >= budget.max_tokens:
                return f"token budget spent ({totals['total_tokens']}/{budget.max_tokens})"
            if budget.max_cost_usd is not None and totals["cost_usd"] >= budget.max_cost_usd:
                return f"cost budget spent (${totals['cost_usd']:.2f}/${budget.max_cost_usd:.2f})"
        if budget.max_wall_s is not None:
            spent = self.store.active_seconds()
            if spent >= budget.max_wall_s:
                return f"time budget spent ({spent:.0f}s/{budget.max_wall_s:.0f}s)"
        return None


def search_context(runtime) -> SearchContext:
    """The nodes' way to their context.

    The CLI passes a ready SearchContext. A LangGraph server can only pass JSON, so it passes a
    ``server.ServerRunContext`` naming the task and run directory, resolved here (once per run dir).
    """
    if isinstance(runtime.context, SearchContext):
        return runtime.context
    from .server import context_for

    return context_for(runtime.context)
