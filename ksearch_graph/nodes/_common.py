"""Small helpers the nodes share."""

from __future__ import annotations

from langgraph.runtime import Runtime

from ..context import SearchContext, search_context
from ..events import Event


def emit(runtime: Runtime[SearchContext], event: Event) -> None:
    """A progress event: to the live stream (CLI, server clients) and to the run's event log."""
    search_context(runtime).store.log_event(event.kind, **event.fields())
    runtime.stream_writer(event.as_message())
