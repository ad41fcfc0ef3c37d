"""A CUDA build's failure, cut to what a coder needs: the first errors, each with the source lines the compiler
printed under it (nvcc's line and caret, gcc's ``N | code`` and ``In function`` context), build paths shortened to
the file's name, and no command lines. The first error is usually the cause and the later ones its echoes, so they
are kept first and the rest counted.

Standard library only: the harness's processes import nothing of ours outside this folder.
"""

from __future__ import annotations

import re

MAX_ERRORS = 5
MAX_CHARS = 1800  # under the harness's log limit (reporting.LOG_LIMIT), which would cut the middle
MAX_CONTEXT_LINES = 8  # printed under one error

# nvcc: "kernel.cu(12): error: ...", gcc/clang: "main.cpp:5:12: error: ...", the linker and the loader.
_ERROR = re.compile(r"(\(\d+\): (catastrophic )?error\b|:\d+(:\d+)?: (fatal )?error\b|\berror: |undefined reference"
                    r"|undefined symbol|ld returned|error LNK)", re.IGNORECASE)
_CONTEXT_START = re.compile(r": In (member )?function|: In instantiation of|: In constructor|required from")
_NOISE = re.compile(r"^(\[\d+/\d+\]|FAILED: |ninja: |Error building extension|subprocess\.|Traceback |  File \")")
_COMMAND = re.compile(r"(^|/)(nvcc|c\+\+|g\+\+|gcc|clang\+\+|x86_64-linux-gnu-g\+\+)\s.*\s-[IDcow]")
_SUMMARY = re.compile(r"\d+ errors? detected in the compilation of")
_PATH = re.compile(r"(?<![\w.)\]])(?:/[^\s:()\"']+)+/([^/\s:()\"']+)")  # absolute paths only, not a/b/c in code


def build_error_excerpt(output: str) -> str:
    """The first errors of a failed build with their source context; "" when the output names no error."""
    lines = [_short_paths(line.rstrip()) for line in output.splitlines()]
    lines = [line for line in lines if not _NOISE.match(line) and not _COMMAND.search(line)]
    blocks: list[list[str]] = []
    pending: list[str] = []  # gcc's "In function ..." line, which belongs to the error after it
    current: list[str] | None = None
    for line in lines:
        if _ERROR.search(line) and not _SUMMARY.search(line):
            current = pending + [line]
            pending = []
            blocks.append(current)
        elif _CONTEXT_START.search(line):
            pending, current = [line], None
        elif current is not None and line.strip() and not _SUMMARY.search(line) and \
                len(current) < MAX_CONTEXT_LINES + 1:
            current.append(line)
        elif not line.strip():
            current = None
    if not blocks:
        return ""
    summaries = list(dict.fromkeys(line.strip() for line in lines if _SUMMARY.search(line)))
    out, used = [], 0
    for block in blocks[:MAX_ERRORS]:
        text = "\n".join(block)
        if out and used + len(text) > MAX_CHARS:
            break
        out.append(text[:MAX_CHARS])
        used += len(text) + 1
    if len(blocks) > len(out):
        out.append(f"[... {len(blocks) - len(out)} more error(s) not shown]")
    return "\n".join(out + summaries)


def _short_paths(line: str) -> str:
    """/root/.cache/ksearch/torch-extensions/ksearch_ext_ab12/src/kernel.cu(12) -> kernel.cu(12)."""
    return _PATH.sub(lambda m: m.group(1), line)
