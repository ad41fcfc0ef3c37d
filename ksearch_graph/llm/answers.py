"""What an LLM's answer holds, read out of its text: the JSON object of a structured answer (``extract_json``, also
inside a fence or after prose) and the files of a coder's answer (``extract_code``: fenced blocks, named by their
info string, a comment or a label before them)."""

from __future__ import annotations

import json
import re
import textwrap
from dataclasses import dataclass
from pathlib import PurePosixPath


class CodeExtractionError(ValueError):
    """The answer holds no usable code, or not the files that were expected."""


def extract_json(text: str) -> object:
    """The JSON value in an LLM answer: the whole text, or the first top-level {...} object in it.

    Prose and ```json fences around the object are tolerated; the object itself must be strict
    JSON (a trailing comma is an error, not silently fixed). Raises ValueError.
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    # When no candidate parses, report on the longest one: it is most likely the intended answer.
    error, error_length = "the answer contains no JSON object", -1
    start = text.find("{")
    while start != -1:
        end = _balanced_end(text, start)
        if end is None:
            if error_length < len(text) - start:
                error = "the answer's JSON object is never closed (was the answer cut off?)"
            break
        try:
            return json.loads(text[start:end])
        except json.JSONDecodeError as exc:
            if error_length < end - start:
                error, error_length = f"the answer's JSON object is not valid JSON: {exc}", end - start
        # Skip past the whole candidate: an object nested in an invalid one is not the answer.
        start = text.find("{", end)
    raise ValueError(error)


def _balanced_end(text: str, start: int) -> int | None:
    """Index just past the brace closing text[start] ('{'), skipping braces inside strings."""
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        ch = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


_FENCE = re.compile(
    r"^[ \t]*(?P<fence>`{3,}|~{3,})(?P<info>[^\n]*)\n(?P<body>.*?)^[ \t]*(?P=fence)[ \t]*$",
    re.MULTILINE | re.DOTALL,
)


# Leading "/" and "." are matched so that unsafe names ("/etc/x.h", "../x.cu") are seen and refused.
# The extension starts with a letter, so a version like "v2.0" is not a file name.
_FILE_NAME = r"[\w./][\w.\-/]*\.[A-Za-z][A-Za-z0-9]*"


# In a fence header: ```cpp kernel.cu, ```kernel.cu or ```cuda title="kernel.h".
_INFO_NAME = re.compile(rf"""(?:title|file(?:name)?)\s*=\s*["']?(?P<name>{_FILE_NAME})|(?P<bare>{_FILE_NAME})""")


# A first line like "// File: main.cpp", "/* kernel.h */" or "# kernel.py".
_COMMENT_NAME = re.compile(
    rf"^\s*(?://|#|/\*)\s*(?:file(?:name)?\s*:\s*)?(?P<name>{_FILE_NAME})\s*(?:\*/)?\s*$", re.IGNORECASE
)


# A line before the fence that is only a file name, maybe decorated: "**kernel.cu**", "### main.cpp",
# "`kernel.h`:", "File: kernel.cu".
_LABEL_NAME = re.compile(
    rf"^[\s#*_`>-]*(?:file(?:name)?\s*:\s*)?[*_`]*(?P<name>{_FILE_NAME})[*_`]*\s*:?\s*$", re.IGNORECASE
)


_PYTHON_TAGS = {"python", "py", "python3", "triton", ""}


@dataclass
class _Block:
    lang: str
    name: str | None
    body: str


def _code_blocks(text: str) -> list[_Block]:
    blocks, previous_end = [], 0
    for match in _FENCE.finditer(text):
        info = match["info"].strip()
        body = textwrap.dedent(match["body"])
        lang = info.split()[0].lower() if info else ""
        name = None
        if found := _INFO_NAME.search(info):
            name = found["name"] or found["bare"]
            if name == info.split()[0]:  # the info string is only a file name, e.g. ```kernel.cu
                lang = ""
        elif found := _COMMENT_NAME.match(body.split("\n", 1)[0]):
            name = found["name"]
        else:
            prose = text[previous_end : match.start()].strip().splitlines()
            if prose and (found := _LABEL_NAME.match(prose[-1])):
                name = found["name"]
        blocks.append(_Block(lang, name, body))
        previous_end = match.end()
    return blocks


def _safe_name(name: str) -> str:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or "\\" in name:
        raise CodeExtractionError(f"refusing unsafe file name {name!r} in the answer")
    return str(path)  # "./kernel.cu" -> "kernel.cu"


def extract_code(
    text: str,
    *,
    language: str,
    expected_files: list[str] | None = None,
    default_file: str = "kernel.py",
) -> dict[str, str]:
    """Source files from an LLM answer's fenced code blocks, as {file name: source}.

    Python-family languages (triton, pytorch, python, cupy): one file, ``default_file``, taken from the
    largest ```python / ```py / ```triton / bare block (later blocks win ties): a short usage
    example after the kernel must not replace it. Other languages (CUDA): one file per block
    named by its fence header (```cpp kernel.cu, ```cuda title="kernel.h"), by a first-line
    comment (// File: main.cpp) or by a line holding only the name just before the block; a
    file given twice keeps its last version. If no block is named and exactly one file is
    expected, a single block is that file. Every file in ``expected_files`` must be present.
    """
    blocks = _code_blocks(text)
    if language in ("triton", "pytorch", "python", "cupy"):
        candidates = [b for b in blocks if b.lang in _PYTHON_TAGS or (b.name or "").endswith(".py")]
        if not candidates:
            raise CodeExtractionError("the answer contains no ```python code block")
        best = max(reversed(candidates), key=lambda b: len(b.body.strip()))
        files = {default_file: best.body}
    else:
        files = {}
        for block in blocks:
            if block.name:
                files[_safe_name(block.name)] = block.body
        if not files and len(blocks) == 1 and expected_files and len(expected_files) == 1:
            files = {expected_files[0]: blocks[0].body}
        if not files:
            raise CodeExtractionError(
                "the answer contains no code block with a file name "
                "(put the name in the fence header, e.g. ```cpp kernel.cu)"
            )
    if any(not body.strip() for body in files.values()):
        raise CodeExtractionError("the answer contains an empty code block")
    missing = [name for name in expected_files or [] if name not in files]
    if missing:
        raise CodeExtractionError(f"the answer lacks the file(s) {missing}; it has {sorted(files)}")
    return files
