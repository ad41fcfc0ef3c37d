"""Using the search inside larger agents: as a node of a parent graph, and as a LangChain tool.

Subgraph. ``kernel_search_node(...)`` returns a node function for a parent ``StateGraph``. It maps
parent state to a search and back (the state mapping is explicit so parent and search keep their
own keys):

    parent state in:   state[task_key]     a task folder
                       state[run_dir_key]  where the search keeps its task copy, store and settings
    parent state out:  {result_key: {"attempt_id", "score", "latency_us", "files", "run_dir", "stop_reason"}}

The search runs as a subgraph of the parent's node, so it uses the parent's checkpointer (resume and
time travel work through the parent's thread) and an ``interrupt`` inside it (``--approve-plans``,
``approve_plans=True`` in the options) pauses the parent; ``Command(resume=...)`` on the parent answers it.

Tool. ``optimize_kernel`` runs a whole search in its own run directory (with its own checkpoints,
so ``ksearch resume RUN_DIR`` continues it later) and returns the best solution.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from langchain_core.tools import tool

from ksearch_graph.config import Budget, SearchConfig
from ksearch_graph.rundir.run_dir import RUN_FILE, RunDir
from ksearch_graph.search.context import ServerRunContext
from ksearch_graph.search.graph import build_search_graph


def _result(run_dir: str | Path, values: dict) -> dict[str, Any]:
    run = RunDir.open(run_dir, read_only=True)
    best = values.get("best")
    store = run.store()
    try:
        files = store.get_source(best["source_hash"]) if best else {}
    finally:
        store.close()
    return {
        "attempt_id": best["attempt_id"] if best else None,
        "score": best["score"] if best else None,
        "latency_us": best["latency_us"] if best else None,
        "files": files,
        "run_dir": str(run.path),
        "thread_id": run.thread_id,
        "stop_reason": values.get("stop_reason"),
    }


def kernel_search_node(*, task_key: str = "task_dir", run_dir_key: str = "run_dir",
                       result_key: str = "kernel_search", options: dict | None = None):
    """A parent-graph node running K-Search as a subgraph (see the module docstring for the mapping)."""
    search = build_search_graph(context_schema=ServerRunContext)

    def run_kernel_search(state: dict) -> dict:
        context = ServerRunContext(task=str(state[task_key]), run_dir=str(state[run_dir_key]), options=options or {})
        values = search.invoke({}, context=context, durability="sync")
        return {result_key: _result(context.run_dir, values)}

    return run_kernel_search


@tool
def optimize_kernel(task_dir: str, run_dir: str, iterations: int = 10, model: str | None = None,
                    base_url: str | None = None) -> dict:
    """Search for a faster GPU kernel for the task in `task_dir` with K-Search.

    Runs (or, if `run_dir` already holds this search, continues) a search of `iterations` attempts.
    Uses the LLM `model` at `base_url` (any OpenAI-compatible endpoint) or, without a model, the
    offline template search. Returns the best kernel's files, its score (speed-up over the task's
    reference), latency in microseconds, and the run directory and thread id to resume it.
    """
    from ksearch_graph.app.runs import drive, extend, has_started, is_finished
    from ksearch_graph.config import LLMSettings
    from ksearch_graph.search.context import make_context

    if (Path(run_dir) / RUN_FILE).exists():
        run = RunDir.open(run_dir)
        if run.config.budget.iterations < iterations:
            extend(run, iterations)
    else:
        llm = LLMSettings(model=model, base_url=base_url) if model else None
        config = SearchConfig(budget=Budget(iterations=iterations), planner="llm" if llm else "offline",
                              planner_llm=llm, coder_llm=llm)
        run = RunDir.create(run_dir, task_dir, config)
    fresh = not has_started(run)
    if fresh or not is_finished(run):
        drive(run, make_context(run), fresh=fresh)
    graph = build_search_graph(run.checkpointer())
    return _result(run.path, graph.get_state(run.graph_config()).values)
