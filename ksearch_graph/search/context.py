"""What every node can reach besides its state: the run's task, settings, store and tools.

Passed to the graph as LangGraph's runtime context (``graph.stream(..., context=ctx)``), so it is
never checkpointed: on resume it is rebuilt from the run directory (``make_context``). A LangGraph
server can only pass JSON, so there a run passes a ``ServerRunContext`` naming its task and run
directory, and ``search_context`` resolves it into a ``SearchContext`` here, once per run directory.
This is the one place a search context is built; the CLI, the server and the nodes only ask for it. How a served
run's directory and pool are opened is ``ServerRunContext.open_run``'s: the app's subclass (app/launch.py) checks
the pool and the task first, as the CLI does.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ksearch_graph.config import Budget, SearchConfig
from ksearch_graph.rundir.run_dir import RUN_FILE, RunDir
from ksearch_graph.rundir.store import RunStore
from ksearch_graph.search.budget import BudgetGate
from ksearch_graph.search.roles.protocol import Coder, Planner
from ksearch_graph.tasks.evaluation import Evaluator
from ksearch_graph.tasks.task import Task


@dataclass
class SearchContext:
    task: Task
    config: SearchConfig
    store: RunStore
    evaluator: Evaluator
    planner: Planner
    coder: Coder
    run_dir: Path
    gpu_note: str | None = None  # an allowed change of GPU model (gpu_record.py), for the caller to show
    budget: BudgetGate = field(init=False)  # the hard budgets, checked from the store (budget.py)
    _speed_of_light: Any = field(default=None, repr=False)

    def speed_of_light(self):
        """The run's GPU and its workloads' work (speed_of_light.py), worked out once per process: the work is
        recorded in the store the first time, so every prompt of the run shows the same figures."""
        if self._speed_of_light is None:
            from ksearch_graph.rundir.gpu_record import recorded_model
            from ksearch_graph.tasks.speed_of_light import SpeedOfLight, run_work

            self._speed_of_light = SpeedOfLight(recorded_model(self.store),
                                                lambda: run_work(self.store, self.task, save=True))
        return self._speed_of_light

    def __post_init__(self):
        self.budget = BudgetGate(self.config, self.store)


def make_agents(config: SearchConfig) -> tuple[Planner, Coder]:
    if config.planner == "offline":
        from ksearch_graph.search.roles.offline import OfflineCoder, OfflinePlanner

        return OfflinePlanner(seed=config.seed), OfflineCoder(seed=config.seed)
    from ksearch_graph.search.roles.llm_roles import make_llm_agents

    return make_llm_agents(config)


def default_evaluator(config: SearchConfig, task: Task) -> Evaluator:
    """The local evaluation pool over every visible GPU (CPU slots without one); the CLI passes its pool options."""
    from ksearch_graph.harness.parent.make_pool import PoolOptions, make_pool

    return make_pool(PoolOptions(), config, task)


def make_context(run: RunDir, *, evaluator: Evaluator | None = None, planner: Planner | None = None,
                 coder: Coder | None = None, allow_gpu_change: bool = False) -> SearchContext:
    """Everything the nodes need, rebuilt from the run directory (never checkpointed). Refuses (GpuModelChanged) an
    evaluator of another GPU model than the run's scores were measured on, unless ``allow_gpu_change``."""
    from ksearch_graph.rundir.gpu_record import check_gpu_model

    if planner is None or coder is None:
        default_planner, default_coder = make_agents(run.config)
        planner, coder = planner or default_planner, coder or default_coder
    task = run.task()
    own_evaluator = evaluator is None
    evaluator = evaluator or default_evaluator(run.config, task)
    try:
        store = run.store()
    except BaseException:
        if own_evaluator:
            getattr(evaluator, "close", lambda: None)()
        raise
    try:
        note = check_gpu_model(store, getattr(evaluator, "model", None), run_path=run.path,
                               allow_change=allow_gpu_change)
    except BaseException:
        store.close()
        if own_evaluator:
            getattr(evaluator, "close", lambda: None)()
        raise
    return SearchContext(
        task=task,
        config=run.config,
        store=store,
        evaluator=evaluator,
        planner=planner,
        coder=coder,
        run_dir=run.path,
        gpu_note=note,
    )


@dataclass
class ServerRunContext:
    """The JSON context of a run on a LangGraph server or in a parent graph (``compose.kernel_search_node``)."""

    task: str  # task folder, as seen by the server process
    run_dir: str  # created on the first run of a thread, reused by later runs (resume, fork)
    # SearchConfig fields, for a new run directory; on a later run (resume, fork) only "budget" is read
    options: dict[str, Any] = field(default_factory=dict)
    allow_gpu_change: bool = False  # resume a run on another GPU model than its scores were measured on

    def open_run(self) -> tuple[RunDir, Evaluator | None]:
        """The run directory, held for writing (created on a thread's first run), and the evaluator its search uses
        (None: make_context's local pool). This room opens it unchecked; the app's subclass preflights."""
        path = Path(self.run_dir).resolve()
        if (path / RUN_FILE).exists():
            run = RunDir.open(path, writer=True)
            if "budget" in self.options:
                try:
                    take_budget(run, self.options["budget"])
                except BaseException:
                    run.lock and run.lock.release()
                    raise
            return run, None
        return RunDir.create(path, self.task, SearchConfig.model_validate(self.options), writer=True), None


_server_contexts: dict[str, SearchContext] = {}
_server_runs: dict[str, RunDir] = {}
_server_lock = threading.Lock()


def context_for(ctx: ServerRunContext | dict) -> SearchContext:
    """The search context of a server run: its run directory opened (or created) once, then reused."""
    if isinstance(ctx, dict):
        ctx = ServerRunContext(**ctx)
    key = str(Path(ctx.run_dir).resolve())
    with _server_lock:
        if key not in _server_contexts:
            # The server process is the run directory's one writer while it serves it (run_lock.py).
            run, evaluator = ctx.open_run()
            try:
                _server_contexts[key] = make_context(run, evaluator=evaluator, allow_gpu_change=ctx.allow_gpu_change)
            except BaseException:
                if evaluator is not None:
                    getattr(evaluator, "close", lambda: None)()
                run.lock and run.lock.release()  # refused (another GPU model) or broken: the directory is not served
                raise
            _server_runs[key] = run
            if _server_contexts[key].gpu_note:
                logging.getLogger(__name__).warning(_server_contexts[key].gpu_note)
        elif "budget" in ctx.options:
            take_budget(_server_runs[key], ctx.options["budget"])
        return _server_contexts[key]


def take_budget(run: RunDir, fields: dict[str, Any]) -> None:
    """A later run of a served directory (a resume, a fork) moves the run's budget, as `ksearch resume
    --iterations` does: budgets are the run's, counted from its store over every path, so a fork needs room."""
    budget = Budget.model_validate({**run.config.budget.model_dump(), **fields})
    if budget != run.config.budget:
        run.config.budget = budget  # the same config object the nodes' BudgetGate reads
        run.save()


def search_context(runtime) -> SearchContext:
    """The nodes' way to their context: the CLI's ready SearchContext, or a server run's, resolved."""
    if isinstance(runtime.context, SearchContext):
        return runtime.context
    return context_for(runtime.context)
