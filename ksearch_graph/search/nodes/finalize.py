"""Final node: write the best kernel next to the run and mark the run finished."""

from __future__ import annotations

from langgraph.runtime import Runtime

from ksearch_graph.search.context import SearchContext, search_context
from ksearch_graph.search.events import FinishedEvent
from ksearch_graph.search.state import SearchState
from ksearch_graph.search.streaming import emit


def finalize(state: SearchState, runtime: Runtime[SearchContext]) -> dict:
    ctx = search_context(runtime)
    best = state.get("best")
    if best:
        out = ctx.run_dir / "best"
        out.mkdir(exist_ok=True)
        for name, text in ctx.store.get_source(best["source_hash"]).items():
            (out / name).write_text(text)
    ctx.store.set_meta("status", "finished")
    emit(runtime, FinishedEvent(reason=state.get("stop_reason"), best=best, iterations=state.get("iterations_done", 0)))
    return {"last_node": "finalize"}
