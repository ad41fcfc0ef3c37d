"""Code instantiation: one codegen for the cycle's next attempt.

Attempt 1 applies the action to the parent's code (or writes from the spec at the root). Later
attempts use the *debug* prompt while nothing in the cycle has passed, and the *improve* prompt on the
cycle's best code once something has (docs/method.md, "The loop", step 3). The code goes to the store; the state keeps
its hash. The answer is cached under the attempt id, so a re-run after a crash reuses it.

With ``samples`` N > 1 a step asks the same prompt N times at once (ids ``c3.2.1`` ... ``c3.2.N``, never more than
the cycle's allowance leaves); compile_and_bench evaluates them side by side and keeps the best.

Before the coder is asked, each attempt claims its iteration from the run's budget (budget.py) and a cap reached
stops the step: a step with no attempt left halts the cycle (``halt``), which reflect then closes.
"""

from __future__ import annotations

import time

from langgraph.runtime import Runtime

from ksearch_graph.rundir.store import attempt_summary
from ksearch_graph.search.context import SearchContext, search_context
from ksearch_graph.search.events import CodegenEvent
from ksearch_graph.search.roles.protocol import CodeRequest
from ksearch_graph.search.state import CycleState, PendingAttempt
from ksearch_graph.search.streaming import emit, side_by_side


def instantiate_code(state: CycleState, runtime: Runtime[SearchContext]) -> dict:
    ctx = search_context(runtime)
    cycle = state["cycle"]
    n_attempts = state.get("n_attempts", 0)
    step = state.get("steps", n_attempts) + 1
    best = state.get("cycle_best")
    kind = "first" if not n_attempts else ("improve" if best else "debug")
    last = state.get("last")
    n = max(1, min(ctx.config.samples, cycle["allowance"] - n_attempts))
    ids = [f"{cycle['id']}.{step}"] if ctx.config.samples == 1 else [f"{cycle['id']}.{step}.{j}" for j in range(1, n + 1)]
    halt = ctx.budget.cap_stop_reason()
    ids = [] if halt else ctx.budget.claim(ids)
    if not ids:
        return {"pending": None, "pending_samples": None, "halt": halt or ctx.budget.iteration_stop_reason()
                or "iteration budget spent"}
    generated = side_by_side(lambda aid: _generate(ctx, runtime, state, aid, kind), ids)
    pending = [PendingAttempt(
        id=attempt_id,
        prompt_kind=kind,
        base_attempt_id=best["id"] if kind == "improve" else cycle["base_attempt_id"],
        parent_attempt_id=last["id"] if last else cycle["base_attempt_id"],
        **cached,
    ) for attempt_id, cached in zip(ids, generated)]
    return {"pending": pending[0], "pending_samples": pending if len(pending) > 1 else None, "steps": step}


def _generate(ctx: SearchContext, runtime: Runtime[SearchContext], state: CycleState, attempt_id: str,
              kind: str) -> dict:
    cycle, best, last = state["cycle"], state.get("cycle_best"), state.get("last")
    cached = ctx.store.get_generation(f"{attempt_id}:code")
    if cached is None:
        start_hash = cycle["base_source_hash"]
        start_summary = {"id": cycle["base_attempt_id"], "score": cycle["base_score"]} if start_hash else None
        start_files = ctx.store.get_source(start_hash) if start_hash else None
        if kind == "improve":
            base_files, base_summary = ctx.store.get_source(best["source_hash"]), best
        else:
            base_files, base_summary = start_files, start_summary
        emit(runtime, CodegenEvent(cycle_id=cycle["id"], attempt_id=attempt_id, prompt_kind=kind))
        history = _history(ctx, cycle["id"])
        request = CodeRequest(
            kind=kind,
            task=ctx.task,
            node_id=cycle["node_id"],
            action=cycle["action"],
            attempt_id=attempt_id,
            base_files=base_files,
            base_summary=base_summary,
            start_files=start_files,
            start_summary=start_summary,
            last_files=ctx.store.get_source(last["source_hash"]) if last and last["source_hash"] else None,
            last_summary=last,
            feedback=state.get("feedback", ""),
            history=history,
            history_files=[ctx.store.get_source(a["source_hash"]) if a["source_hash"] else {} for a in history],
            analysis=ctx.store.analysis(),
            sol=ctx.speed_of_light(),
        )
        started = time.monotonic()
        answer = ctx.coder.write(request)
        seconds = time.monotonic() - started
        answer.usage.seconds = seconds
        ctx.store.record_llm_call("coder", "code", answer.usage.as_dict(), seconds)
        ctx.store.record_exchanges(f"{attempt_id}:code", "coder", kind, answer.usage.transcript)
        cached = {
            "source_hash": ctx.store.put_source(answer.files) if answer.files else None,
            "error": answer.error,
            "prompt_tokens": answer.usage.prompt_tokens,
            "completion_tokens": answer.usage.completion_tokens,
            "codegen_s": seconds,
        }
        ctx.store.put_generation(f"{attempt_id}:code", cached)
    return cached


def _history(ctx: SearchContext, cycle_id: str) -> list[dict]:
    """The cycle's attempts so far, oldest first: their summaries, failure logs and the attempt each started from
    (an improve attempt the cycle's best then, any other the attempt before it)."""
    rows = [ctx.store.get_attempt(a["id"]) for a in ctx.store.cycle_attempts(cycle_id)]
    return [{**attempt_summary(r), "log": r["log_excerpt"],
             "derived_from": r["base_attempt_id"] if r["prompt_kind"] == "improve" else r["parent_attempt_id"]}
            for r in rows if r is not None]
