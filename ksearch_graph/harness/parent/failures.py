"""Failures the candidate did not cause: evaluations that could not judge it.

The evaluation's own machinery can fail: a pool slot or a Ray worker (the package missing there, the worker lost),
the judge's process (it crashed, or died before it wrote a result), the candidate's sandboxed process before any
candidate code ran in it (its sandbox could not start), the task's reference, the disk the evaluation writes to. Such a result is not the candidate's. ``infrastructure_error`` makes one (status
``infrastructure_error``, ``infrastructure`` saying what failed); ``classify`` recognises the judge's and the
client's own reports of such failures in a result that came back under another status.
"""

from __future__ import annotations

import re

from ksearch_graph.harness.job import (  # noqa: F401
    BEFORE_CANDIDATE_CODE,
    JUDGE_CRASH,
    REFERENCE_IN_RUNNER,
    RUNNER_DIED,
    TASK_REFERENCE,
)
from ksearch_graph.tasks.evaluation import EvalResult, Status

# What client.py writes when it could not get a result from the judge (the judge's own words are job.py's):
JUDGE_LOST = "the evaluation process was "  # the judge died, or exited, without writing a result
CANNOT_START = "cannot start "  # the judge's process could not be started (no disk, no interpreter)
UNREADABLE = "unreadable result file"  # the judge's result file was cut (a full disk)


def infrastructure_error(reason: str, log: str = "") -> EvalResult:
    """A result that says the evaluation failed outside the candidate: ``reason`` in one line, ``log`` the detail."""
    return EvalResult(status=Status.infrastructure_error, infrastructure=reason, log_excerpt=(log or reason)[:2000])


def classify(result: EvalResult, *, reference: str | None = None) -> EvalResult:
    """``result``, or an infrastructure_error where it reports a failure of the evaluation itself. ``reference``: the
    task's reference file name, whose failures (a syntax error in it, say) are the task's."""
    if result.status == Status.infrastructure_error:
        return result
    log = result.log_excerpt or ""
    reason = None
    if result.status == Status.runtime_error:
        if log.startswith((TASK_REFERENCE, REFERENCE_IN_RUNNER)) or (
                log.startswith(JUDGE_CRASH) and reference and _in_file(log, reference)):
            reason = "the task's reference failed (a task bug)"
        elif log.startswith(RUNNER_DIED) and log.split("\n")[0].endswith(
                tuple(f" during {phase}" for phase in BEFORE_CANDIDATE_CODE)):
            reason = "the candidate's process died before any candidate code ran: its sandbox, or the machine"
        elif log.startswith(JUDGE_CRASH):
            reason = "the evaluation's judge process crashed"
        elif log.startswith(JUDGE_LOST):
            reason = "the evaluation's judge process was " + log[len(JUDGE_LOST):].split(";")[0].split("\n")[0]
        elif log.startswith(UNREADABLE):
            reason = "the evaluation's result file could not be read"
    elif result.status == Status.unavailable and log.startswith(CANNOT_START):
        reason = "the evaluation's processes could not be started"
    if reason is None:
        return result
    out = infrastructure_error(reason, log)
    out.environment = dict(result.environment)
    out.wall_s = result.wall_s
    return out


def _in_file(log: str, name: str) -> bool:
    """Whether a traceback in ``log`` passes through a file named ``name`` (``File ".../reference.py", line 3``)."""
    return re.search(r'File "([^"]*/)?' + re.escape(name) + '"', log) is not None
