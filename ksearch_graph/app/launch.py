"""Launching a search: what is checked before a run, a resume or a campaign writes anything, and the writes after.

``ksearch run``, ``resume`` and ``campaign``, the LangChain tool (compose.py) and a server's or a parent graph's run
(``CheckedRunContext``) all start searches here, so each gets the same checks in the same order: the options, the
evaluation pool (made here, with the same defaults for every caller), the run's GPU model, then preflight
(preflight.py) of the pool and of the task. A refusal closes the pool and leaves nothing written.

Nothing here prints: progress lines go to ``say`` and warnings to ``warn`` (the CLI prints them to stdout and
stderr). Driving the search once launched is runs.py's ``drive``; the CLI adds live progress and Ctrl-C on top.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ksearch_graph.app.campaign import Campaign
from ksearch_graph.app.preflight import Preflight, check_task_on, preflight, sandbox_failure
from ksearch_graph.app.runs import (
    ResumePlan,
    has_started,
    is_finished,
    mark_finished,
    plan_resume,
    record_preflight,
    seed_measured,
)
from ksearch_graph.config import SearchConfig
from ksearch_graph.harness.parent.make_pool import PoolOptions
from ksearch_graph.rundir.run_dir import RUN_FILE, RunDir, RunDirError
from ksearch_graph.search.context import ServerRunContext
from ksearch_graph.tasks.evaluation import Evaluator
from ksearch_graph.tasks.task import Task, TaskError, load_task

Say = Callable[[str], None]

UNSANDBOXED = ("warning: --sandbox none: candidates' code runs without a sandbox, as you, and can read your files "
               "and credentials; every result records it (isolation)")


def make_evaluator(options: PoolOptions, config: SearchConfig, task: Task) -> Evaluator:
    """The evaluation pool a search will use, made before anything is written (a bad option, a Ray cluster that
    cannot be joined, or a host that cannot make the candidates' sandbox stops the search with nothing left
    behind)."""
    from ksearch_graph.harness.parent.client import SandboxUnavailable
    from ksearch_graph.harness.parent.make_pool import make_pool
    from ksearch_graph.harness.parent.pool import PoolError

    try:
        return make_pool(options, config, task)
    except PoolError as e:
        raise RunDirError(str(e)) from None
    except SandboxUnavailable as e:
        raise sandbox_failure(str(e)) from None


def close(evaluator: Evaluator | None) -> None:
    """Stop the pool's processes (an evaluator that is no pool has nothing to stop)."""
    if evaluator is not None:
        getattr(evaluator, "close", lambda: None)()


def warn_if_unsandboxed(config: SearchConfig, warn: Say | None) -> None:
    if config.sandbox == "none" and warn is not None:
        warn(UNSANDBOXED)


def run_preflight(evaluator: Evaluator, task: Task, *, check_task: bool = True, say: Say | None = None) -> Preflight:
    """preflight.py's checks of the pool (and the task) before anything is spent; PreflightFailed stops."""
    if say is not None:
        say(f"preflight: checking the evaluation pool{' and task ' + task.name if check_task else ''} ...")
    checked = preflight(evaluator, task, check_task=check_task)
    if say is not None:
        say(checked.summary())
    return checked


def preflight_task(evaluator: Evaluator, task: Task, *, say: Say | None = None) -> Preflight:
    """The task's part of preflight alone (the pool was probed already)."""
    files, result, evaluated = check_task_on(evaluator, task)
    if say is not None:
        say(f"preflight: task {task.name}: " + ("its seed passes" if evaluated == "seed" else
                                                "its reference runs" if evaluated else "not evaluated"))
    return Preflight(files=files, result=result, evaluated=evaluated)


# ---------------------------------------------------------------------------------------------------- a new run


@dataclass
class StartPlan:
    """A new search, checked (``plan_start``): the task, the pool and the task on the pool. Nothing is written
    until ``commit``; a caller that drops the plan closes ``evaluator``."""

    task_folder: Path
    run_dir: Path
    config: SearchConfig
    evaluator: Evaluator
    preflight: Preflight

    def commit(self, *, writer: bool = True, record_seed: bool = True) -> RunDir:
        """Make the run directory (whole or not at all) with the preflight's record, and start the pool's first
        evaluations' processes on the run's task. ``writer``: the run stays locked for this process;
        ``record_seed``: the preflight's measurement of the seed is the run's (else the search measures it)."""
        try:
            run = RunDir.create(self.run_dir, self.task_folder, self.config, writer=writer)
            record_preflight(run, self.preflight if record_seed else without_seed(self.preflight))
        except BaseException:
            close(self.evaluator)
            raise
        getattr(self.evaluator, "start_ahead", lambda task: None)(run.task())
        return run


def default_run_dir(task: Task) -> Path:
    return Path("runs") / f"{task.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def plan_start(task_folder: str | Path, run_dir: str | Path | None, config: SearchConfig,
               pool_options: PoolOptions | None = None, *, say: Say | None = None,
               warn: Say | None = None) -> StartPlan:
    """Check a new search before anything is written: the task (TaskError with its own message), that the planner
    can search it, that ``run_dir`` (default runs/<task>-<time>) holds no run, the pool, the task on the pool."""
    warn_if_unsandboxed(config, warn)
    task = load_task(task_folder)
    if config.planner == "offline" and task.spec.template is None:
        raise TaskError(f"task {task.name} has no kernel template, so the offline (no-LLM) planner cannot "
                        "search it; search it with an LLM: --model M [--base-url URL], or --llm local")
    run_dir = Path(run_dir) if run_dir else default_run_dir(task)
    if (run_dir / RUN_FILE).exists():
        raise RunDirError(f"{run_dir} already holds a run; use `ksearch resume {run_dir}` or another --run-dir")
    evaluator = make_evaluator(pool_options or PoolOptions(), config, task)
    try:
        checked = run_preflight(evaluator, task, say=say)
    except BaseException:
        close(evaluator)
        raise
    return StartPlan(Path(task_folder), run_dir, config, evaluator, checked)


def start_search(task_folder: str | Path, run_dir: str | Path | None, config: SearchConfig,
                 pool_options: PoolOptions | None = None, *, say: Say | None = None, warn: Say | None = None,
                 writer: bool = True, record_seed: bool = True) -> tuple[RunDir, Evaluator, Preflight]:
    """``plan_start`` then ``commit``: the new run, the pool it is evaluated on, what preflight found."""
    plan = plan_start(task_folder, run_dir, config, pool_options, say=say, warn=warn)
    return plan.commit(writer=writer, record_seed=record_seed), plan.evaluator, plan.preflight


def without_seed(checked: Preflight) -> Preflight:
    """The preflight's record without its measurement of the seed, which the search then makes itself."""
    return dataclasses.replace(checked, result=None)


# ---------------------------------------------------------------------------------------------------- resume


@dataclass
class Resumed:
    """A run checked and opened to continue (``resume_search``), held for writing by this process."""

    plan: ResumePlan
    evaluator: Evaluator | None  # the pool to drive it on; None when the run is finished
    extended: bool  # the budget grew on a finished run, which continues
    fresh: bool  # the search has not started yet (drive it from its input)

    @property
    def run(self) -> RunDir:
        return self.plan.run

    @property
    def finished(self) -> bool:
        return self.evaluator is None


def checked_pool(run: RunDir, pool_options: PoolOptions | None = None, *,
                 allow_gpu_change: bool = False) -> Evaluator:
    """The pool a resumed run will use, refused (GpuModelChanged) if its GPU model is not the one the run's scores
    were measured on, unless ``allow_gpu_change`` (docs/scale-out.md, "GPU models"). Only a check: an allowed change
    is recorded when the search runs (make_context), not by a resume that finds nothing to do."""
    from ksearch_graph.rundir.gpu_record import check_gpu_model

    evaluator = make_evaluator(pool_options or PoolOptions(), run.config, run.task())
    store = run.store()
    try:
        check_gpu_model(store, getattr(evaluator, "model", None), run_path=run.path,
                        allow_change=allow_gpu_change, record=False)
    except BaseException:
        close(evaluator)
        raise
    finally:
        store.close()
    return evaluator


def preflighted_pool(run: RunDir, pool_options: PoolOptions | None = None, *, allow_gpu_change: bool = False,
                     say: Say | None = None) -> tuple[Evaluator, Preflight]:
    """An existing run's pool (``checked_pool``) and its preflight (the task's part while the run's seed is not
    measured yet); the pool is closed on a refusal."""
    evaluator = checked_pool(run, pool_options, allow_gpu_change=allow_gpu_change)
    try:
        return evaluator, run_preflight(evaluator, run.task(), check_task=not seed_measured(run), say=say)
    except BaseException:
        close(evaluator)
        raise


def resume_search(run_dir: str | Path, *, answer: str | None = None, base_url: str | None = None,
                  model: str | None = None, sandbox: str | None = None, iterations: int | None = None,
                  more: int | None = None, pool_options: PoolOptions | None = None, allow_gpu_change: bool = False,
                  say: Say | None = None, warn: Say | None = None) -> Resumed:
    """Continue a run as ``ksearch resume`` does: every option checked against the run (``plan_resume``); while
    something is left to search, the pool (its GPU model the run's) and preflight (the task's part while its seed is
    not measured yet); then the settings, the record and the budget written. A finished run is marked so and its
    pool closed. On a refusal nothing is written and the run's lock is released."""
    plan = plan_resume(run_dir, answer=answer, base_url=base_url, model=model, sandbox=sandbox,
                       iterations=iterations, more=more)
    run = plan.run
    evaluator = None
    try:
        warn_if_unsandboxed(run.config, warn)
        checked = None
        if plan.searches:
            evaluator, checked = preflighted_pool(run, pool_options, allow_gpu_change=allow_gpu_change, say=say)
        extended = plan.commit(checked)
        if is_finished(run):
            close(evaluator)
            evaluator = None
            mark_finished(run)
        return Resumed(plan, evaluator, extended, fresh=not has_started(run))
    except BaseException:
        close(evaluator)
        run.lock and run.lock.release()
        raise


# ---------------------------------------------------------------------------------------------------- campaign


def start_campaign(runs_dir: Path, tasks: list[Task], config: SearchConfig, pool_options: PoolOptions | None = None,
                   *, sandbox: str | None = None, allow_gpu_change: bool = False, say: Say | None = None,
                   warn: Say | None = None) -> tuple[Campaign, Evaluator | None]:
    """A campaign made (or an existing one opened) and checked: the tasks, one pool for every search, each search's
    GPU model, preflight (the pool once, then each task whose seed is not measured yet). The campaign is made whole
    or not at all, after the checks. ``sandbox`` moves an existing campaign's searches to it (None: they keep
    theirs). Returns the pool to run it on, None when every search is finished."""
    campaign = Campaign.open(runs_dir, tasks)
    if campaign is None:
        Campaign.check_tasks(tasks, config)
        todo = {task.name: (None, task) for task in tasks}
    else:
        todo = {name: (run, run.task()) for name, run in campaign.unfinished().items()}
    if not todo:  # a campaign whose searches are all finished: nothing to check or run
        return campaign, None
    first = next(iter(todo.values()))
    run_config = first[0].config if first[0] is not None else config
    if sandbox is not None:
        run_config = run_config.model_copy(update={"sandbox": sandbox})
    warn_if_unsandboxed(run_config, warn)
    evaluator = make_evaluator(pool_options or PoolOptions(), run_config, first[1])
    try:
        if campaign is not None:
            campaign.check_gpu_models(evaluator, allow_gpu_change=allow_gpu_change)
        checked = {}
        for i, (name, (run, task)) in enumerate(todo.items()):
            measure = run is None or not seed_measured(run)
            if i == 0 or measure:  # the pool once, each task whose seed is not measured yet
                checked[name] = run_preflight(evaluator, task, check_task=measure, say=say) if i == 0 \
                    else preflight_task(evaluator, task, say=say)
        if campaign is None:
            campaign = Campaign.create(runs_dir, tasks, config)
        for name, found in checked.items():
            record_preflight(RunDir.open(campaign.path / campaign.runs[name]), found)
        for run, _ in todo.values():  # an existing campaign's searches told to change their sandbox
            if run is not None and run.config.sandbox != run_config.sandbox:
                run.config.sandbox = run_config.sandbox
                run.save()
    except BaseException:
        close(evaluator)
        raise
    return campaign, evaluator


# ---------------------------------------------------------------------------------------------------- served runs


class CheckedRunContext(ServerRunContext):
    """The context of a run on a LangGraph server or in a parent graph, opened as the CLI opens one: a new run
    directory only after the pool and the task pass preflight, an existing one on a pool of its GPU model
    (``allow_gpu_change``) with the pool preflighted. The pool is the local one, with the CLI's defaults.

    The search measures the seed again: a served run's stream shows the seed's measurement as its first attempt
    event, and clients read it there."""

    def open_run(self) -> tuple[RunDir, Evaluator | None]:
        say = logging.getLogger(__name__).info
        path = Path(self.run_dir).resolve()
        if not (path / RUN_FILE).exists():
            run, evaluator, _ = start_search(self.task, path, SearchConfig.model_validate(self.options), say=say,
                                             warn=logging.getLogger(__name__).warning, record_seed=False)
            return run, evaluator
        run, _ = super().open_run()
        try:
            evaluator, checked = preflighted_pool(run, allow_gpu_change=self.allow_gpu_change, say=say)
        except BaseException:
            run.lock and run.lock.release()
            raise
        try:
            record_preflight(run, without_seed(checked))
        except BaseException:
            close(evaluator)
            run.lock and run.lock.release()
            raise
        return run, evaluator
