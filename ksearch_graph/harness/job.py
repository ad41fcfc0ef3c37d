"""The wire between the parent (``parent/client.py``) and the judge process (``judge/judge.py``): the judge's options,
which travel as its command line; the job, one JSON object on its stdin; and the words the parent reads in the
judge's progress lines and failure messages. Both sides build and parse from here, so each is spelled once.

Standard library only: the judge imports this before torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from dataclasses import dataclass, field, fields

from ksearch_graph.harness.reporting import PROGRESS

# Progress lines (``PROGRESS`` + text on the judge's stderr) that tell the parent how far a prestarted judge got.
WAITING = "started; waiting for the job"  # its last line before it has its job
RECEIVED = "job received"  # its first line after
AHEAD = "timing the reference while waiting for the job"  # before WAITING, with --time-reference-ahead
RESULT_KEY_ENV = "KSEARCH_RESULT_KEY"  # signs the result file, so a forged or overwritten one is recognised

# What the judge and the candidate's process write when a failure is the task's or the harness's, not the
# candidate's (``parent/failures.py`` classifies results by them).
TASK_REFERENCE = "the task's reference or baseline failed"  # judge: the reference raised (a task bug)
JUDGE_CRASH = "evaluation failed: "  # judge: its catch-all for a harness or task problem
REFERENCE_IN_RUNNER = "the task's reference failed to load in the candidate's process"  # runner: a task bug
RUNNER_DIED = "the candidate's process "  # judge: "... exited with code 1 during <phase>"
STARTING_RUNNER = "starting the candidate's process"  # judge: the phases before any candidate code runs; the
LOADING_TASK = "loading the task in the candidate's process"  # candidate's process dying in one is not its doing
BEFORE_CANDIDATE_CODE = (STARTING_RUNNER, LOADING_TASK)

_DEFAULT_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "ksearch_graph")


def _option(default, help: str, **extra):
    return field(default=default, metadata={"help": help, **extra})


@dataclass
class JudgeOptions:
    """The judge process's options: ``command_line()`` in the parent, ``parse()`` in the judge."""

    candidate: str = _option(None, "folder with the candidate's files", required=True)
    out: str = _option(None, "where to write the result JSON", required=True)
    task: str | None = _option(None, "task folder (with task.json)")
    workloads: str = _option("", "comma-separated workload names (default: all)")
    seeds_from_env: bool = _option(False, "take the base input seed from $KSEARCH_EVAL_SEED")
    time_budget_s: float = _option(1.0, "timing budget per workload, for the candidate and the reference each")
    compile_timeout_s: float = _option(300.0, "limit for importing/building the candidate, and for its first call "
                                              "(JIT compile)")
    call_timeout_s: float = _option(60.0, "limit for any other single call")
    cache_dir: str = _option(_DEFAULT_CACHE, "compile caches shared by evaluations, keyed by source hash")
    lock_dir: str = _option("/tmp", "where the per-device timing lock lives")
    memory_limit_gb: float = _option(32.0, "host memory (resident) the candidate's process, and the judge's, may each "
                                           "use: the candidate's is killed past it; the judge refuses a workload whose "
                                           "inputs would not fit")
    no_network_isolation: bool = _option(False, "without a sandbox: do not put the candidate in its own network "
                                                "namespace")
    sandbox: str = _option("bwrap", "run the candidate's process in bubblewrap (default), or without any sandbox",
                           choices=("bwrap", "none"))
    eval_cache: str | None = _option(None, "this evaluation's compile cache folder (writable by the candidate; "
                                           "default: a new one)")
    job_from_stdin: bool = _option(False, "start both processes, then wait for the job on stdin (a Job: task, "
                                          "workloads and reusable reference timings); replaces --task and --workloads")
    time_reference_ahead: bool = _option(False, "with --job-from-stdin and --task: time that task's reference (and "
                                                "baseline) on its --workloads while waiting for the job; used when "
                                                "the job is for the same task")
    standby_limit_s: float = _option(900.0, "with --job-from-stdin: give up when no job has come after this long")

    def command_line(self) -> list[str]:
        """The arguments that give the judge these options (only those that differ from the defaults)."""
        argv = []
        for f in fields(self):
            value = getattr(self, f.name)
            flag = "--" + f.name.replace("_", "-")
            if f.metadata.get("required") or value != f.default:
                if isinstance(value, bool):
                    argv += [flag] if value else []
                elif value is not None:
                    argv += [flag, str(value)]
        return argv

    @classmethod
    def parse(cls, argv: list[str] | None, description: str) -> JudgeOptions:
        parser = argparse.ArgumentParser(description=description)
        for f in fields(cls):
            flag, meta = "--" + f.name.replace("_", "-"), f.metadata
            if f.type == "bool":
                parser.add_argument(flag, action="store_true", help=meta["help"])
            else:
                kind = {"float": float, "str": str}.get(f.type.split(" |")[0], str)
                parser.add_argument(flag, type=kind, default=f.default, help=meta["help"],
                                    required=meta.get("required", False), choices=meta.get("choices"))
        args = parser.parse_args(argv)
        if not (args.task or args.job_from_stdin):
            parser.error("--task is required (or --job-from-stdin)")
        return cls(**vars(args))

    @property
    def memory_limit_bytes(self) -> int:
        return int(self.memory_limit_gb * 2**30)

    def with_job(self, job: Job) -> JudgeOptions:
        return dataclasses.replace(self, task=job.task, workloads=job.workloads)


@dataclass(frozen=True)
class Job:
    """What a prestarted judge waits for: the task, its workloads, and reference timings of an earlier evaluation
    of the same task on this GPU ({"key", "workloads"}), reused when they still apply."""

    task: str
    workloads: str = ""
    timings: dict = field(default_factory=dict)

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self)).encode()

    @classmethod
    def from_json(cls, text: str) -> Job:
        """The job, checked field by field; ValueError names what is wrong."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, got {type(data).__name__}")
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown fields {sorted(unknown)}")
        task, workloads, timings = data.get("task"), data.get("workloads") or "", data.get("timings") or {}
        if not isinstance(task, str) or not task:
            raise ValueError("it names no task folder ('task')")
        if not isinstance(workloads, str):
            raise ValueError("'workloads' must be a comma-separated string")
        if not isinstance(timings, dict):
            raise ValueError("'timings' must be an object")
        return cls(task, workloads, timings)


def progress_line(text: str) -> str:
    """How a progress line of the judge's reads on its stderr."""
    return PROGRESS + text
