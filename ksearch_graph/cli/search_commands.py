"""The ``ksearch`` commands that drive a search: run, resume and campaign (the parser is cli.py's).

They pick the search's settings from the options, make the evaluation pool, drive the graph with live progress
and answer its plan approvals. Exit codes 69 (the evaluation infrastructure failed), 75 (paused: the LLM endpoint
failed) and 76 (waiting for an answer) are set here; cli.py's docstring lists them all.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from ksearch_graph.app.runs import (
    mark_finished,
    parse_answer,
    record_preflight,
    seed_measured,
)
from ksearch_graph.config import Budget, SearchConfig
from ksearch_graph.rundir.run_dir import RunDir, RunDirError
from ksearch_graph.tasks.task import TaskError, load_task

EXIT_INFRASTRUCTURE = 69  # the evaluation infrastructure failed (preflight, or down mid-run): fix it, then resume
EXIT_PAUSED = 75
EXIT_WAITING = 76  # --approve-plans: the run waits for a person's answer (`ksearch resume DIR --answer ...`)
OFFLINE_NOTICE = (
    "planner: OFFLINE (no LLM). This is the no-LLM baseline that walks the task's kernel template, "
    "not K-Search's intelligence. Pass --model (and --base-url) to search with an LLM, or --llm local."
)


def _pool_options(args):
    from ksearch_graph.harness.parent.make_pool import PoolOptions

    return PoolOptions(gpus=args.gpus, cpu_slots=args.cpu_slots, ray=args.ray, ray_address=args.ray_address,
                       gpu_model=args.gpu_model, lanes_per_gpu=args.lanes_per_gpu)


def _make_evaluator(options, config: SearchConfig, task):
    """The evaluation pool a search will use, made before anything is written (a bad option, a Ray cluster that
    cannot be joined, or a host that cannot make the candidates' sandbox stops the command with nothing left
    behind)."""
    from ksearch_graph.app.preflight import sandbox_failure
    from ksearch_graph.harness.parent.client import SandboxUnavailable
    from ksearch_graph.harness.parent.make_pool import make_pool
    from ksearch_graph.harness.parent.pool import PoolError

    try:
        return make_pool(options, config, task)
    except PoolError as e:
        raise RunDirError(str(e)) from None
    except SandboxUnavailable as e:
        raise sandbox_failure(str(e)) from None


def _warn_unsandboxed(config: SearchConfig) -> None:
    if config.sandbox == "none":
        print("warning: --sandbox none: candidates' code runs without a sandbox, as you, and can read your files "
              "and credentials; every result records it (isolation)", file=sys.stderr, flush=True)


def _preflight(evaluator, task, *, check_task: bool = True, quiet: bool = False):
    """preflight.py's checks of the pool (and the task) before anything is spent; PreflightFailed stops."""
    from ksearch_graph.app.preflight import preflight

    if not quiet:
        print(f"preflight: checking the evaluation pool{' and task ' + task.name if check_task else ''} ...",
              flush=True)
    checked = preflight(evaluator, task, check_task=check_task)
    if not quiet:
        print(checked.summary(), flush=True)
    return checked


def _config_from_args(args) -> SearchConfig:
    from ksearch_graph.config import LLMSettings

    if args.llm == "local":
        if args.offline or args.model or args.planner_model or args.coder_model or args.base_url:
            raise SystemExit("ksearch: --llm local chooses the model and endpoint itself; drop --offline, "
                             "--model, --planner-model, --coder-model and --base-url")
        use_llm = True
    else:
        use_llm = bool(args.model or args.planner_model or args.coder_model) and not args.offline
    settings = {}
    if args.llm == "local":
        settings = {role: _local_settings(args) for role in ("planner_llm", "coder_llm")}
    elif use_llm:
        for role, name in (("planner_llm", args.planner_model or args.model), ("coder_llm", args.coder_model or args.model)):
            if not name:
                raise SystemExit(f"ksearch: --{role.split('_')[0]}-model or --model is needed")
            settings[role] = LLMSettings(model=name, base_url=args.base_url, api_key_env=args.api_key_env,
                                         structured_method=args.structured_method, temperature=args.temperature,
                                         max_retries=args.llm_retries, backoff_s=args.llm_backoff)
    return SearchConfig(
        budget=Budget(iterations=args.iterations, max_tokens=args.max_tokens, max_cost_usd=args.max_cost,
                      max_wall_s=args.max_wall),
        parallel_cycles=args.parallel_cycles,
        samples=args.samples,
        rolling_cycles=not args.rounds,
        stagnation_window=args.stagnation_window,
        difficulty_cap=args.difficulty_cap,
        policy=args.policy,
        noise_margin=args.noise_margin,
        eval_timeout_s=args.eval_timeout,
        planner="llm" if use_llm else "offline",
        seed=args.seed,
        approve_plans=args.approve_plans,
        sandbox=args.sandbox or "bwrap",
        **settings,
    )


def _local_settings(args):
    from ksearch_graph.config import LLMSettings
    from ksearch_graph.llm.local import model_id

    # Small models answer best cold and short: a low temperature, an answer limit that leaves most of
    # a small context to the prompt, and a tighter schema for the server to decode against. A local server
    # cannot be slow because of a network, only because of a busy CPU: a long timeout wastes nothing,
    # a retry would redo the whole answer.
    return LLMSettings(model=model_id(args.local_model), local_model=args.local_model, structured_method="json_schema",
                       temperature=0.2 if args.temperature is None else args.temperature, max_tokens=2048,
                       small_model_schema=True, timeout_s=1200, max_retries=args.llm_retries, backoff_s=args.llm_backoff)


@contextmanager
def _local_endpoint(run: RunDir):
    """For a run with a local model: its server, started for this drive, the settings pointed at it.

    The address and context live only in memory; run.json keeps the settings without them.
    """
    roles = [s for s in (run.config.planner_llm, run.config.coder_llm) if s is not None and s.local_model]
    if not roles:
        yield
        return
    from ksearch_graph.llm.local import CAPABILITIES, MODELS, local_server_for

    name = roles[0].local_model
    print(f"starting the local model server ({MODELS[name].title}; log: {run.path / 'local_llm.log'}) ...", flush=True)
    with local_server_for(name, log_path=run.path / "local_llm.log") as server:
        print(CAPABILITIES.format(title=MODELS[name].title, threads=server.threads, context=server.context_tokens))
        for settings in roles:
            settings.base_url, settings.context_tokens = server.base_url, server.context_tokens
        INTERRUPT_CLEANUPS.append(server.stop)  # Ctrl-C leaves through os._exit, past this block's exit
        try:
            yield
        finally:
            INTERRUPT_CLEANUPS.remove(server.stop)
            for settings in roles:
                settings.base_url, settings.context_tokens = None, None


def _drive(run: RunDir, *, fresh: bool, quiet: bool, answer: dict | None = None, evaluator=None,
           allow_gpu_change: bool = False) -> int:
    from ksearch_graph.llm.local import LocalModelError

    try:
        with _local_endpoint(run):
            return _drive_search(run, fresh=fresh, quiet=quiet, answer=answer, evaluator=evaluator,
                                 allow_gpu_change=allow_gpu_change)
    except LocalModelError as e:
        print(f"\nksearch: the local model is not available:\n  {e}\nFix it, then: ksearch resume {run.path}",
              file=sys.stderr)
        return EXIT_PAUSED
    except KeyboardInterrupt:  # while the local server was starting; the search has its own handler
        print(f"\nksearch: interrupted. Resume with: ksearch resume {run.path}", file=sys.stderr)
        return 130


# Called (newest first) before the process leaves on Ctrl-C / SIGTERM, e.g. to stop a local LLM server.
INTERRUPT_CLEANUPS: list = []


@contextmanager
def _exit_on_interrupt(run: RunDir):
    """Ctrl-C and SIGTERM end the search at once.

    LangGraph would otherwise let the nodes in flight finish first (an evaluation can take minutes).
    Leaving mid-step is safe: every checkpoint is on disk (durability="sync"), nodes are idempotent
    against the store, and the evaluation child dies with us (PDEATHSIG). ``resume`` redoes the step.
    """
    import signal
    import sqlite3

    def leave(signum, frame):
        print(f"\nksearch: interrupted. Resume with: ksearch resume {run.path}", file=sys.stderr, flush=True)
        try:  # a fresh connection: the store's own lock may be held by a worker thread right now
            with sqlite3.connect(str(run.path / "store.sqlite"), timeout=2) as db:
                db.execute("insert or replace into meta (key, value) values ('status', '\"interrupted\"')")
        except sqlite3.Error:
            pass
        for cleanup in reversed(INTERRUPT_CLEANUPS):
            try:
                cleanup()
            except Exception:
                pass
        sys.stdout.flush()
        os._exit(130)

    previous = {s: signal.signal(s, leave) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _show_question(q: dict) -> None:
    a = q["action"]
    print(f"\n[approval] next plan: {q['node_id']}: {a['title']} (V={a['value']}, difficulty {a['difficulty']})")
    print(f"  {a['description']}")
    if q.get("problem"):
        print(f"  ({q['problem']})")
    others = [f"{f['id']} {f['title']} (V={f['value']})" for f in q["frontier"] if f["id"] != q["node_id"]]
    if others:
        print("  other open actions: " + "; ".join(others))


def _drive_search(run: RunDir, *, fresh: bool, quiet: bool, answer: dict | None = None, evaluator=None,
                  allow_gpu_change: bool = False) -> int:
    from ksearch_graph.app.runs import drive, pending_question
    from ksearch_graph.cli.progress import ProgressPrinter, show_llm_heartbeats
    from ksearch_graph.llm.client import EndpointUnavailable, LLMConfigError
    from ksearch_graph.search.context import make_context
    from ksearch_graph.search.infrastructure import InfrastructureDown
    from ksearch_graph.search.nodes.world_model_update import PlannerFailed

    ctx = make_context(run, evaluator=evaluator, allow_gpu_change=allow_gpu_change)
    if ctx.gpu_note:
        print(ctx.gpu_note)
    print(OFFLINE_NOTICE if run.config.planner == "offline" else
          f"planner: {run.config.planner_llm.model}  coder: {run.config.coder_llm.model}"
          + (f"  endpoint: {run.config.planner_llm.base_url}" if run.config.planner_llm.base_url else ""))
    printer = None if quiet else ProgressPrinter(ctx.store, run.config.budget.iterations)
    if not quiet:
        show_llm_heartbeats()
    started = time.monotonic()
    try:
        with _exit_on_interrupt(run):
            final = drive(run, ctx, fresh=fresh, on_event=printer, answer=answer)
            while (question := pending_question(run)) is not None:
                _show_question(question)
                if not sys.stdin.isatty():
                    ctx.store.set_meta("status", "waiting")
                    print(f"\nksearch: waiting for approval. Answer with: ksearch resume {run.path} "
                          "--answer 'approve' | 'stop' | 'pick ID' | 'edit {\"description\": ...}'")
                    return EXIT_WAITING
                try:
                    answer = parse_answer(input("approve / pick ID / edit JSON / stop > "))
                except RunDirError as e:
                    print(f"  {e}")
                    continue
                final = drive(run, ctx, fresh=False, on_event=printer, answer=answer)
    except (EndpointUnavailable, LLMConfigError) as e:
        ctx.store.set_meta("status", "paused")
        ctx.store.log_event("paused", error=str(e))
        print(f"\nksearch: run paused, the LLM endpoint failed:\n  {e}\n"
              f"Nothing computed so far is lost. Fix the endpoint, then: ksearch resume {run.path}", file=sys.stderr)
        return EXIT_PAUSED
    except PlannerFailed as e:
        ctx.store.set_meta("status", "paused")
        print(f"\nksearch: run paused: {e}\nResume with: ksearch resume {run.path}", file=sys.stderr)
        return EXIT_PAUSED
    except InfrastructureDown as e:
        ctx.store.set_meta("status", "paused")
        ctx.store.log_event("infrastructure_down", attempt_id=e.attempt_id, reasons=e.reasons)
        print(f"\nksearch: run stopped: {e}.\nFix the evaluation pool (see the reasons above), then: "
              f"ksearch resume {run.path} (the candidate is evaluated again, its code reused)", file=sys.stderr)
        return EXIT_INFRASTRUCTURE
    best = final.get("best")
    print(f"\ndone in {time.monotonic() - started:.1f}s: {final.get('stop_reason')}")
    if best:
        print(f"best: {best['attempt_id']} score {best['score']:.4g}x"
              + (f", {best['latency_us']:.4g} us" if best.get("latency_us") else "")
              + f" -> {run.path / 'best'}")
    else:
        print("no candidate passed")
    return 0


@contextmanager
def _task_folder(task_arg: str, definition: str | None):
    """The task folder for `ksearch run TASK`: a task folder (or its task.json) as it is; a FlashInfer-Trace
    definition (a definitions/**.json file, or a dataset root with --definition), a KernelBench problem (.py) or a
    GPU MODE problem folder (task.yml + reference.py) materialised into a temporary folder, which RunDir.create then
    copies into RUN_DIR/task (task_sources.py)."""
    import tempfile

    from ksearch_graph.tasks.task_sources import materialise

    with tempfile.TemporaryDirectory(prefix="ksearch-task-") as tmp:
        yield materialise(Path(task_arg), Path(tmp) / "task", definition)


def cmd_run(args) -> int:
    from ksearch_graph.rundir.run_dir import RUN_FILE

    config = _config_from_args(args)
    options = _pool_options(args)
    _warn_unsandboxed(config)
    if config.planner == "offline" and (os.environ.get(args.api_key_env) and not args.offline):
        print(f"note: {args.api_key_env} is set but no --model was given; using the offline planner")
    with _task_folder(args.task, args.definition) as task_folder:
        task = load_task(task_folder)  # fail early, with the task's own error message
        if config.planner == "offline" and task.spec.template is None:
            raise TaskError(f"task {task.name} has no kernel template, so the offline (no-LLM) planner cannot "
                            "search it; search it with an LLM: --model M [--base-url URL], or --llm local")
        run_dir = Path(args.run_dir or Path("runs") / f"{task.name}-{time.strftime('%Y%m%d-%H%M%S')}")
        if (run_dir / RUN_FILE).exists():
            raise RunDirError(f"{run_dir} already holds a run; use `ksearch resume {run_dir}` or another --run-dir")
        # Everything is checked before anything is written: the options, the pool, the task on the pool.
        evaluator = _make_evaluator(options, config, task)
        try:
            checked = _preflight(evaluator, task, quiet=args.quiet)
            args.run_dir = run_dir  # for an error message about it
            run = RunDir.create(run_dir, task_folder, config, writer=True)
        except BaseException:
            getattr(evaluator, "close", lambda: None)()
            raise
    record_preflight(run, checked)
    getattr(evaluator, "start_ahead", lambda task: None)(run.task())
    print(f"run directory: {run.path}")
    return _drive(run, fresh=True, quiet=args.quiet, evaluator=evaluator)


def cmd_resume(args) -> int:
    from ksearch_graph.app.runs import has_started, is_finished, plan_resume

    plan = plan_resume(args.run_dir, answer=args.answer, base_url=args.base_url, model=args.model,
                       sandbox=args.sandbox, iterations=args.iterations, more=args.more)
    run = plan.run
    _warn_unsandboxed(run.config)
    evaluator = checked = None
    if plan.searches:
        evaluator = _checked_pool(run, args)  # a pool of another GPU model stops here, before anything is written
        try:  # the pool (and a task whose seed is not measured yet) checked before anything is spent
            checked = _preflight(evaluator, run.task(), check_task=not seed_measured(run), quiet=args.quiet)
        except BaseException:
            getattr(evaluator, "close", lambda: None)()
            raise
    if plan.commit(checked):
        print(f"budget raised to {plan.target} iterations; the finished run continues")
    if is_finished(run):
        getattr(evaluator, "close", lambda: None)()
        mark_finished(run)
        print(f"{run.path}: the run is finished (continue it with --more N, N more iterations)")
        return 0
    return _drive(run, fresh=not has_started(run), quiet=args.quiet, answer=plan.answer, evaluator=evaluator,
                  allow_gpu_change=args.allow_gpu_change)


def _checked_pool(run: RunDir, args):
    """The pool a resumed run will use, refused (GpuModelChanged) if its GPU model is not the one the run's scores
    were measured on, unless --allow-gpu-change (docs/scale-out.md, "GPU models"). Only a check: an allowed change
    is recorded when the search runs (make_context), not by a resume that finds nothing to do."""
    from ksearch_graph.rundir.gpu_record import check_gpu_model

    evaluator = _make_evaluator(_pool_options(args), run.config, run.task())
    store = run.store()
    try:
        check_gpu_model(store, getattr(evaluator, "model", None), run_path=run.path,
                        allow_change=args.allow_gpu_change, record=False)
    except BaseException:
        getattr(evaluator, "close", lambda: None)()
        raise
    finally:
        store.close()
    return evaluator


def cmd_campaign(args) -> int:
    """Everything is checked before anything is written: the tasks, the pool, each task on the pool (preflight);
    then the campaign is made (whole or not at all) and its searches run side by side."""
    from contextlib import ExitStack

    from ksearch_graph.app.campaign import Campaign

    config = _config_from_args(args)
    options = _pool_options(args)
    runs_dir = Path(args.runs_dir)
    with ExitStack() as folders:
        tasks = [load_task(folders.enter_context(_task_folder(t, None))) for t in args.tasks]
        campaign = Campaign.open(runs_dir, tasks)
        if campaign is None:
            Campaign.check_tasks(tasks, config)
            todo = {task.name: (None, task) for task in tasks}
        else:
            todo = {name: (run, run.task()) for name, run in campaign.unfinished().items()}
        if not todo:  # a campaign whose searches are all finished: nothing to check or run
            print(campaign.table())
            print(f"report: {campaign.write_report()}")
            return 0
        first = next(iter(todo.values()))
        run_config = first[0].config if first[0] is not None else config
        if args.sandbox is not None:  # a campaign run again keeps its searches' sandbox unless told otherwise
            run_config = run_config.model_copy(update={"sandbox": args.sandbox})
        _warn_unsandboxed(run_config)
        evaluator = _make_evaluator(options, run_config, first[1])  # one pool for every search of the campaign
        try:
            if campaign is not None:
                campaign.check_gpu_models(evaluator, allow_gpu_change=args.allow_gpu_change)
            checked = {}
            for i, (name, (run, task)) in enumerate(todo.items()):
                measure = run is None or not seed_measured(run)
                if i == 0 or measure:  # the pool once, each task whose seed is not measured yet
                    checked[name] = _preflight(evaluator, task, check_task=measure, quiet=args.quiet) if i == 0 \
                        else _preflight_task(evaluator, task, quiet=args.quiet)
            if campaign is None:
                campaign = Campaign.create(runs_dir, tasks, config)
        except BaseException:
            getattr(evaluator, "close", lambda: None)()
            raise
    for name, found in checked.items():
        record_preflight(RunDir.open(campaign.path / campaign.runs[name]), found)
    for run, _ in todo.values():  # an existing campaign's searches told to change their sandbox
        if run is not None and run.config.sandbox != run_config.sandbox:
            run.config.sandbox = run_config.sandbox
            run.save()
    print(f"campaign {args.runs_dir}: {', '.join(campaign.runs)}")
    try:
        failed = campaign.run(evaluator, quiet=args.quiet, allow_gpu_change=args.allow_gpu_change)
    finally:
        getattr(evaluator, "close", lambda: None)()
    print(campaign.table())
    print(f"report: {campaign.write_report()}")
    return EXIT_PAUSED if failed else 0


def _preflight_task(evaluator, task, *, quiet: bool):
    """The task's part of preflight alone (the pool was probed already)."""
    from ksearch_graph.app.preflight import Preflight, check_task_on

    files, result, evaluated = check_task_on(evaluator, task)
    if not quiet:
        print(f"preflight: task {task.name}: " + ("its seed passes" if evaluated == "seed" else
                                                  "its reference runs" if evaluated else "not evaluated"), flush=True)
    return Preflight(files=files, result=result, evaluated=evaluated)
