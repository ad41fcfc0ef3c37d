"""How both processes report: a Failure ends an evaluation with a status and the message the LLM sees; progress lines
on stderr say where a killed process was."""

from __future__ import annotations

import os
import sys
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
