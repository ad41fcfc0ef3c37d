"""Reflection: stagnation bookkeeping, feedback for the next attempt, continue or close the cycle.

An attempt improves the cycle when it passes and beats the cycle's best by the noise margin. After W
(stagnation window) non-improving attempts in a row, when the cycle's iteration allowance is spent,
or when the run's budget (iterations, tokens, cost, time; budget.py) allows no further attempt, the cycle ends and
its result goes to the parent. A cycle halted before its next attempt (``halt``) ends with the attempts it has.
"""

from __future__ import annotations

from langgraph.graph import END
from langgraph.runtime import Runtime

from ksearch_graph.search.context import SearchContext, search_context
from ksearch_graph.search.events import CycleFinishedEvent
from ksearch_graph.search.roles.prompt_parts import performance_table
from ksearch_graph.search.state import CycleResult, CycleState
from ksearch_graph.search.streaming import emit
from ksearch_graph.tasks.evaluation import EvalResult


def _feedback(ctx: SearchContext, last: dict, best: dict | None) -> str:
    if last["status"] != "passed":
        row = ctx.store.get_attempt(last["id"])
        log = row["log_excerpt"] if row else ""
        return f"Attempt {last['id']} failed with status {last['status']}.\n{log}".strip()
    lines = [f"Attempt {last['id']} passed: score {last['score']:.4g}x vs the reference"
             + (f", {last['latency_us']:.4g} us (geometric mean)" if last["latency_us"] else "") + "."]
    if best and best["id"] != last["id"]:
        lines.append(f"The cycle's best is still {best['id']} at {best['score']:.4g}x.")
    row = ctx.store.get_attempt(last["id"])
    if row:
        # Per workload against the reference, the baseline and the floor (prompt_parts.performance_table).
        table = performance_table(EvalResult.model_validate_json(row["result"]), ctx.speed_of_light())
        if table:
            lines.append(table)
    return "\n".join(lines)


def reflect(state: CycleState, runtime: Runtime[SearchContext]) -> dict:
    ctx = search_context(runtime)
    if state.get("halt"):
        return _close(runtime, state, state["halt"], {"halt": None})
    cycle = state["cycle"]
    n_attempts = state["n_attempts"]
    last = state["last"]
    best = state.get("cycle_best")
    improved = last["status"] == "passed" and (
        best is None or last["score"] > best["score"] * (1 + ctx.config.noise_margin)
    )
    if improved:
        best, stagnation = last, 0
    else:
        stagnation = state.get("stagnation", 0) + 1

    stop = None
    if stagnation >= ctx.config.stagnation_window:
        stop = f"stagnated ({stagnation} attempts without improvement)"
    elif n_attempts >= cycle["allowance"]:
        stop = f"iteration allowance spent ({n_attempts})"
    else:
        stop = ctx.budget.stop_reason()

    update = {"cycle_best": best, "stagnation": stagnation, "feedback": _feedback(ctx, last, best)}
    if stop is None:
        return update
    return _close(runtime, {**state, **update}, stop, update)


def _close(runtime: Runtime[SearchContext], state: CycleState, stop: str, update: dict) -> dict:
    """End the cycle: its result (best attempt, attempts made, why) goes to the parent."""
    cycle, best, n_attempts = state["cycle"], state.get("cycle_best"), state.get("n_attempts", 0)
    emit(runtime, CycleFinishedEvent(cycle_id=cycle["id"], node_id=cycle["node_id"], passed=best is not None,
                                     best_attempt=best["id"] if best else None, attempts=n_attempts, reason=stop))
    result = CycleResult(cycle_id=cycle["id"], node_id=cycle["node_id"], best=best, n_attempts=n_attempts, stop=stop)
    return {**update, "stop": stop, "finished_cycles": [result], "last_node": "action_cycle"}


def continue_or_close(state: CycleState) -> str:
    if not state.get("stop"):
        return "instantiate_code"
    return "next_cycle" if state["cycle"].get("round") else END
