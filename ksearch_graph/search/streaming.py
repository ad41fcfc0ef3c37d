"""What the nodes share: ``emit`` (a progress event to the live stream and the run's event log) and ``side_by_side``
(threads that keep LangGraph's context variables)."""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from langgraph.runtime import Runtime

from ksearch_graph.search.context import SearchContext, search_context
from ksearch_graph.search.events import Event


def emit(runtime: Runtime[SearchContext], event: Event) -> None:
    """A progress event: to the live stream (CLI, server clients) and to the run's event log."""
    search_context(runtime).store.log_event(event.kind, **event.fields())
    runtime.stream_writer(event.as_message())


T = TypeVar("T")


def side_by_side(fn: Callable[..., T], items: list) -> list[T]:
    """``fn`` over ``items`` in threads, each in a copy of this node's context (LangGraph's config and stream
    writer live in context variables); results in order."""
    if len(items) == 1:
        return [fn(items[0])]
    contexts = [contextvars.copy_context() for _ in items]
    with ThreadPoolExecutor(len(items)) as pool:
        return list(pool.map(lambda c, item: c.run(fn, item), contexts, items))
