"""Inputs a candidate may write: output buffers passed among the inputs (GPU MODE's ``(A, B, output)``).

task.json ``"writable_inputs": ["inputs[0][2]", "inputs[0]['out']"]`` names them by their path in the tuple
make_inputs returns, written as the harness names input paths elsewhere (tensors.without_added_keys): an integer per
tuple or list position, a quoted key per dict entry, ``[*]`` for every element (``inputs[0][0][*][2]``). Every
other input must still come back unchanged; these are left out of that check and out of the fingerprints taken before
a call (``without_writable``), and the candidate's output is still what is checked.
"""

from __future__ import annotations

import re

PATH = re.compile(r"inputs((?:\[(?:\d+|\*|'[^'\\]*'|\"[^\"\\]*\")\])+)")
PART = re.compile(r"\[(\d+|\*|'[^'\\]*'|\"[^\"\\]*\")\]")
EVERY = "*"  # every position of a list or tuple, every key of a dict: a buffer in each group of a grouped GEMM
MAX_PATHS = 64


def parse_path(text: str) -> tuple:
    """``inputs[0]['out']`` -> (0, "out"); ValueError for anything else."""
    if not isinstance(text, str) or not PATH.fullmatch(text):
        raise ValueError(f"{text!r} is not an input path like inputs[0][2] or inputs[0]['out']")
    return tuple(int(p) if p.isdigit() else p if p == EVERY else p[1:-1] for p in PART.findall(text))


def parse_writable(raw, where: str) -> list[str]:
    """task.json's "writable_inputs", validated (a list of distinct input paths); the list itself is returned."""
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > MAX_PATHS:
        raise ValueError(f"{where}: \"writable_inputs\" must be a list of at most {MAX_PATHS} input paths, got "
                         f"{str(raw)[:200]}")
    for text in raw:
        try:
            parse_path(text)
        except ValueError as e:
            raise ValueError(f"{where}: writable_inputs: {e}") from None
    if len(set(raw)) != len(raw):
        raise ValueError(f"{where}: writable_inputs names a path twice")
    return list(raw)


def writable_paths(task: dict) -> list[tuple]:
    return [parse_path(p) for p in task.get("writable_inputs") or []]


def without_writable(value, paths: list[tuple]):
    """``value`` (the inputs tuple) rebuilt with every writable leaf replaced by None, for ``compare.same`` and
    ``tensors.fingerprint``; the live structure is left as it is. A path that does not fit the inputs (a missing key,
    a position past the end) leaves them as they are: the check then sees the buffer, as without the declaration."""
    if not paths:
        return value
    heads: dict = {}
    for path in paths:
        if path:
            heads.setdefault(path[0], []).append(path[1:])
    every = heads.pop(EVERY, [])
    if isinstance(value, (list, tuple)):
        items = list(value)
        for i in range(len(items)):
            rests = heads.get(i, []) + every
            if rests:
                items[i] = None if () in rests else without_writable(items[i], rests)
        return type(value)(items) if type(value) in (list, tuple) else tuple(items)
    if isinstance(value, dict):
        out = dict(value)
        for k in out:
            rests = heads.get(k, []) + every
            if rests:
                out[k] = None if () in rests else without_writable(out[k], rests)
        return out
    return value
