"""How both processes report: a Failure ends an evaluation with a status and the message the LLM sees; progress lines
on stderr say where a killed process was."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

LOG_LIMIT = 2000
PROGRESS = "[ksearch-eval] "


class Reported(Exception):
    """A failure already sent to the judge: the process only has to end."""


class Failure(Exception):
    """Ends the evaluation with ``status``; ``message`` becomes the log excerpt the LLM sees."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def progress(msg: str) -> None:
    # The parent shows the last of these lines when it has to kill us, so a hang says where it hung.
    print(PROGRESS + msg, file=sys.stderr, flush=True)


def clip(text: str, limit: int = LOG_LIMIT) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def describe(exc: BaseException, root: str) -> str:
    """The exception message plus the last frames of the candidate's own code, not the whole traceback."""
    frames, chain, seen = [], exc, set()
    while chain is not None and id(chain) not in seen:  # Triton's interpreter re-raises `from` the original error
        seen.add(id(chain))
        frames += [f for f in traceback.extract_tb(chain.__traceback__) if f.filename.startswith(root)]
        chain = chain.__cause__ or chain.__context__
    text = "".join(f'  File "{f.filename}", line {f.lineno}, in {f.name}\n    {f.line}\n' for f in frames[-2:])
    text += "".join(traceback.format_exception_only(type(exc), exc))
    return clip(text.replace(root + os.sep, ""))


def _rounded(v):
    """A trace figure, a number or (nested) lists of them, rounded: lists to 0.1 us, a single figure to 0.001."""
    if isinstance(v, list):
        return [_rounded(x) if isinstance(x, list) else round(x, 1) for x in v]
    return round(v, 3)


class TimingTrace:
    """The judge's timing trace: every burst's timed calls, one JSON line each, appended to ``path`` (the TRACE_ENV
    file; None: no trace)."""

    def __init__(self, path: str | None):
        self.path = path

    def write(self, who: str, workload: str, first: int, calls: list, dropped: bool = False,
              bound: dict | None = None) -> None:
        """One burst's timed calls into the TRACE_ENV file, where one is named; ``at``: when the judge had them (wall
        clock, s), which spaces the bursts (the judge's checks come between a workload's); ``dropped``: not in the
        result (by the SideStreamRule, or the judge's clock contradicted it)."""
        if not self.path:
            return
        line = {"who": who, "workload": workload, "first": first, "at": round(time.time(), 4),
                "calls": [[round(v, 2) for v in c] for c in calls]}
        if dropped:
            line["dropped"] = True
        if bound:  # time_bound.py's figures: the judge's interval per call (its steps) and its calibration
            line["bound"] = {k: _rounded(v) for k, v in bound.items()}
        try:
            with open(self.path, "a") as f:
                f.write(json.dumps(line) + "\n")
        except OSError as e:  # a diagnostic: it must not fail the evaluation
            progress(f"timing trace off: cannot write {self.path}: {e}")
            self.path = None
