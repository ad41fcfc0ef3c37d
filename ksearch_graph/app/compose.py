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

Both launch their searches through app/launch.py, as ``ksearch run`` and ``ksearch resume`` do: the local pool with
the CLI's defaults, preflight of the pool and the task before a run directory is written, the run's GPU model kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from langchain_core.tools import tool

from ksearch_graph.app.launch import CheckedRunContext, close, resume_search, start_search
from ksearch_graph.app.runs import drive
from ksearch_graph.config import Budget, LLMSettings, SearchConfig
from ksearch_graph.rundir.run_dir import RUN_FILE, RunDir
from ksearch_graph.search.context import make_context
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
    search = build_search_graph(context_schema=CheckedRunContext)

    def run_kernel_search(state: dict) -> dict:
        context = CheckedRunContext(task=str(state[task_key]), run_dir=str(state[run_dir_key]), options=options or {})
        values = search.invoke({}, context=context, durability="sync")
        return {result_key: _result(context.run_dir, values)}

    return run_kernel_search


@tool
def optimize_kernel(task_dir: str, run_dir: str, iterations: int = 10, model: str | None = None,
                    base_url: str | None = None) -> dict:
    """Search for a faster GPU kernel for the task in `task_dir` with K-Search.

    Runs (or, if `run_dir` already holds this search, continues) a search of `iterations` attempts; a
    larger `iterations` than the search's budget raises it, and a finished search continues.
    Uses the LLM `model` at `base_url` (any OpenAI-compatible endpoint) or, without a model, the
    offline template search. The task and the evaluation pool are checked before anything is written.
    Returns the best kernel's files, its score (speed-up over the task's reference), latency in
    microseconds, and the run directory and thread id to resume it.
    """
    if (Path(run_dir) / RUN_FILE).exists():  # continued as `ksearch resume RUN_DIR --iterations N` would
        budget = RunDir.open(run_dir, read_only=True).config.budget.iterations
        resumed = resume_search(run_dir, iterations=iterations if iterations > budget else None)
        run, evaluator, fresh = resumed.run, resumed.evaluator, resumed.fresh
    else:
        llm = LLMSettings(model=model, base_url=base_url) if model else None
        config = SearchConfig(budget=Budget(iterations=iterations), planner="llm" if llm else "offline",
                              planner_llm=llm, coder_llm=llm)
        run, evaluator, _ = start_search(task_dir, run_dir, config)
        fresh = True
    try:
        if evaluator is not None:  # None: the search is finished
            ctx = make_context(run, evaluator=evaluator)
            try:
                drive(run, ctx, fresh=fresh)
            finally:
                ctx.store.close()
        values = build_search_graph(run.checkpointer()).get_state(run.graph_config()).values
    finally:
        close(evaluator)
        run.lock and run.lock.release()
    return _result(run.path, values)
