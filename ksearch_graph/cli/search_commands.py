"""The ``ksearch`` commands that drive a search: run, resume and campaign (the parser is main.py's).

They pick the search's settings from the options, launch the search through app/launch.py (the checks before
anything is written: the pool, its GPU model, preflight), print what it reports, drive the graph with live progress
and Ctrl-C handling, and answer its plan approvals. Exit codes 69 (the evaluation infrastructure failed), 75 (paused:
the LLM endpoint failed) and 76 (waiting for an answer) are set here; main.py's docstring lists them all.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from ksearch_graph.app.launch import close, plan_start, resume_search, start_campaign
from ksearch_graph.app.runs import parse_answer
from ksearch_graph.config import Budget, SearchConfig
from ksearch_graph.harness.parent.make_pool import PoolOptions
from ksearch_graph.rundir.run_dir import RunDir, RunDirError
from ksearch_graph.tasks.task import load_task

EXIT_INFRASTRUCTURE = 69  # the evaluation infrastructure failed (preflight, or down mid-run): fix it, then resume
EXIT_PAUSED = 75
EXIT_WAITING = 76  # --approve-plans: the run waits for a person's answer (`ksearch resume DIR --answer ...`)
OFFLINE_NOTICE = (
    "planner: OFFLINE (no LLM). This is the no-LLM baseline that walks the task's kernel template, "
    "not K-Search's intelligence. Pass --model (and --base-url) to search with an LLM, or --llm local."
)


def _pool_options(args) -> PoolOptions:
    return PoolOptions(gpus=args.gpus, cpu_slots=args.cpu_slots, ray=args.ray, ray_address=args.ray_address,
                       gpu_model=args.gpu_model, lanes_per_gpu=args.lanes_per_gpu)


def _say(text: str) -> None:
    print(text, flush=True)


def _warn(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


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
    config = _config_from_args(args)
    options = _pool_options(args)
    if config.planner == "offline" and (os.environ.get(args.api_key_env) and not args.offline):
        print(f"note: {args.api_key_env} is set but no --model was given; using the offline planner")
    with _task_folder(args.task, args.definition) as task_folder:
        # Everything is checked before anything is written: the options, the pool, the task on the pool.
        plan = plan_start(task_folder, args.run_dir, config, options, say=None if args.quiet else _say, warn=_warn)
        args.run_dir = plan.run_dir  # for an error message about it
        run = plan.commit()
    print(f"run directory: {run.path}")
    return _drive(run, fresh=True, quiet=args.quiet, evaluator=plan.evaluator)


def cmd_resume(args) -> int:
    resumed = resume_search(args.run_dir, answer=args.answer, base_url=args.base_url, model=args.model,
                            sandbox=args.sandbox, iterations=args.iterations, more=args.more,
                            pool_options=_pool_options(args), allow_gpu_change=args.allow_gpu_change,
                            say=None if args.quiet else _say, warn=_warn)
    run = resumed.run
    if resumed.extended:
        print(f"budget raised to {resumed.plan.target} iterations; the finished run continues")
    if resumed.finished:
        print(f"{run.path}: the run is finished (continue it with --more N, N more iterations)")
        return 0
    return _drive(run, fresh=resumed.fresh, quiet=args.quiet, answer=resumed.plan.answer,
                  evaluator=resumed.evaluator, allow_gpu_change=args.allow_gpu_change)


def cmd_campaign(args) -> int:
    """Everything is checked before anything is written (app/launch.py's start_campaign); then the campaign's
    searches run side by side."""
    from contextlib import ExitStack

    config = _config_from_args(args)
    options = _pool_options(args)
    with ExitStack() as folders:
        tasks = [load_task(folders.enter_context(_task_folder(t, None))) for t in args.tasks]
        campaign, evaluator = start_campaign(Path(args.runs_dir), tasks, config, options, sandbox=args.sandbox,
                                             allow_gpu_change=args.allow_gpu_change,
                                             say=None if args.quiet else _say, warn=_warn)
    if evaluator is None:  # every search is finished: nothing to run
        print(campaign.table())
        print(f"report: {campaign.write_report()}")
        return 0
    print(f"campaign {args.runs_dir}: {', '.join(campaign.runs)}")
    try:
        failed = campaign.run(evaluator, quiet=args.quiet, allow_gpu_change=args.allow_gpu_change)
    finally:
        close(evaluator)
    print(campaign.table())
    print(f"report: {campaign.write_report()}")
    return EXIT_PAUSED if failed else 0
