"""The search graph as a LangGraph server app (``langgraph.json`` points here).

Imports are absolute: the server loads this file by path, not as part of the package.

The server supplies its own checkpointer and can only pass JSON, so a run names its task and run
directory in its context (a ``launch.CheckedRunContext``); the nodes resolve the heavy parts (task,
store, evaluator, planner, coder) from that, once per run directory, after the checks ``ksearch run`` and
``ksearch resume`` make (the local pool with their defaults, its GPU model, preflight):

    client.runs.stream(thread_id, "ksearch", input={},
                       context={"task": "examples/softmax", "run_dir": "runs/server-1", "options": {...}})

``options`` are ``SearchConfig`` fields (e.g. {"budget": {"iterations": 5}}). The run directory holds the
task copy, settings and artifact store, as for the CLI; its checkpoints live in the server.
"""

from __future__ import annotations

from ksearch_graph.app.launch import CheckedRunContext
from ksearch_graph.search.graph import build_search_graph


def make_graph():
    """Graph factory for ``langgraph dev`` / LangGraph Server: the same graph as the CLI, no checkpointer."""
    return build_search_graph(checkpointer=None, context_schema=CheckedRunContext)
