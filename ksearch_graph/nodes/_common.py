"""Small helpers the nodes share."""

from __future__ import annotations

from langgraph.runtime import Runtime

from ..context import SearchContext, search_context


def emit(runtime: Runtime[SearchContext], kind: str, **data) -> None:
    """A typed progress event: to the live stream (CLI, server clients) and to the run's event log."""
    search_context(runtime).store.log_event(kind, **data)
    runtime.stream_writer({"event": kind, **data})
