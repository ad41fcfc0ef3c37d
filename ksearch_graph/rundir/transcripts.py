"""What the LLMs were asked and what they answered, as the run directory keeps it.

Every request a planner or coder call makes (its messages, repair rounds included) and the raw answer are recorded
in ``store.sqlite`` (table ``exchanges``), under the key of the generation they produced: ``c3.2:code`` for attempt
c3.2's code, ``init:0``, ``update:c3:1``, ``refill:c4:0`` for the planner. One record is a JSON list compressed with
LZMA, whose large window also folds the repeats of a repair round (the same prompt sent again).
"""

from __future__ import annotations

import json
import lzma


def pack(transcript: list[dict]) -> bytes:
    return lzma.compress(json.dumps(transcript, ensure_ascii=False).encode(), preset=6)


def unpack(data: bytes) -> list[dict]:
    return json.loads(lzma.decompress(data).decode())


def keys_for_attempt(attempt_id: str) -> list[str]:
    """The generation keys an id names: an attempt's code (``c3.2`` -> ``c3.2:code``), or a planner call as
    ``ksearch show --attempt`` accepts it (``init``, ``update:c3``, ``refill:c4``: all its retries)."""
    if attempt_id.startswith(("init", "update:", "refill:")):
        return [attempt_id]
    return [f"{attempt_id}:code"]


def render(exchange: dict) -> str:
    """One recorded call as text: every request's messages, then its raw answer."""
    out = []
    calls = exchange["transcript"]
    for i, call in enumerate(calls, 1):
        tokens = f"{call.get('prompt_tokens', 0)} prompt tokens ({call.get('cached_prompt_tokens', 0)} cached), " \
                 f"{call.get('completion_tokens', 0)} completion tokens"
        out.append(f"===== {exchange['key']} ({exchange['role']}), request {i} of {len(calls)}: {tokens}")
        for message in call["messages"]:
            out.append(f"----- {message['role']}\n{message['content'].rstrip()}")
        out.append(f"----- answer (raw)\n{call['answer'].rstrip()}")
    return "\n".join(out)
