"""The search graph as a LangGraph server app (``langgraph.json`` points here).

Imports are absolute: the server loads this file by path, not as part of the package.

The server supplies its own checkpointer and can only pass JSON, so a run names its task and run
directory in its context and the nodes resolve the heavy parts (task, store, evaluator, planner,
coder) from that, once per run directory:

    client.runs.stream(thread_id, "ksearch", input={},
                       context={"task": "examples/softmax", "run_dir": "runs/server-1", "options": {...}})

``options`` are ``SearchConfig`` fields (e.g. {"budget": {"iterations": 5}}). The run directory holds the
task copy, settings and artifact store, as for the CLI; its checkpoints live in the server.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ksearch_graph.config import SearchConfig
from ksearch_graph.context import SearchContext
from ksearch_graph.graph import build_search_graph
from ksearch_graph.run_dir import RUN_FILE, RunDir


@dataclass
class ServerRunContext:
    task: str  # task folder, as seen by the server process
    run_dir: str  # created on the first run of a thread, reused by later runs (resume, fork)
    options: dict[str, Any] = field(default_factory=dict)


_contexts: dict[str, SearchContext] = {}
_lock = threading.Lock()


def context_for(ctx: ServerRunContext | dict) -> SearchContext:
    if isinstance(ctx, dict):
        ctx = ServerRunContext(**ctx)
    key = str(Path(ctx.run_dir).resolve())
    with _lock:
        if key not in _contexts:
            from ksearch_graph.search import make_context

            # The server process is the run directory's one writer while it serves it (run_lock.py).
            if (Path(key) / RUN_FILE).exists():
                run = RunDir.open(key, writer=True)
            else:
                run = RunDir.create(key, ctx.task, SearchConfig.model_validate(ctx.options), writer=True)
            _contexts[key] = make_context(run)
        return _contexts[key]


def make_graph():
    """Graph factory for ``langgraph dev`` / LangGraph Server: the same graph as the CLI, no checkpointer."""
    return build_search_graph(checkpointer=None, context_schema=ServerRunContext)
