"""Each node of the search graph on its own: called as LangGraph calls it, with a runtime that carries a real run
directory's context (store, budgets, the offline planner and coder) and an instant evaluator that scores a template
instance from its parameters without running it. The end-to-end searches are tests/test_graph.py's (slow tier)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from conftest import SOFTMAX
from langgraph.types import Send

from ksearch_graph.app.runs import start
from ksearch_graph.config import Budget, SearchConfig
from ksearch_graph.search.context import make_context
from ksearch_graph.search.cycles import fresh_cycle_state
from ksearch_graph.search.nodes.compile_and_bench import compile_and_bench
from ksearch_graph.search.nodes.finalize import finalize
from ksearch_graph.search.nodes.instantiate_code import instantiate_code
from ksearch_graph.search.nodes.next_cycle import after_next_cycle, lane_start, next_cycle
from ksearch_graph.search.nodes.reflect import continue_or_close, reflect
from ksearch_graph.search.nodes.select_plans import launch_cycles, select_plans
from ksearch_graph.search.nodes.world_model_update import init_world_model, update_world_model
from ksearch_graph.search.roles.offline import params_of
from ksearch_graph.search.state import CLEAR
from ksearch_graph.search.world_model import ROOT, WorldModel
from ksearch_graph.tasks.evaluation import EvalResult, Status


class InstantEvaluator:
    """Scores a softmax template instance from its parameters; the single-pass variant with a short block is wrong."""

    def __init__(self):
        self.calls: list[str] = []

    def evaluate(self, task, files, *, attempt_id):
        self.calls.append(attempt_id)
        p = params_of(files)
        if p.get("VARIANT") == "single_pass" and p.get("BLOCK_N", 0) < 4096:
            return EvalResult(status=Status.incorrect_numerical, log_excerpt="max abs error 0.9 at [0, 300]")
        score = p.get("BLOCK_N", 256) / 256 * p.get("ROWS_PER_PROGRAM", 1) ** 0.5
        return EvalResult(status=Status.passed, score=score, latency_us=100 / score)


class FlatEvaluator(InstantEvaluator):
    """Every candidate scores the same: a cycle stagnates after its first attempt."""

    def evaluate(self, task, files, *, attempt_id):
        self.calls.append(attempt_id)
        return EvalResult(status=Status.passed, score=1.0, latency_us=100.0)


def runtime(ctx) -> SimpleNamespace:
    """What a node reads of LangGraph's Runtime: its context and its stream writer (events kept for the test)."""
    events: list = []
    return SimpleNamespace(context=ctx, stream_writer=events.append, events=events)


@pytest.fixture
def rt(tmp_path):
    config = SearchConfig(budget=Budget(iterations=4), stagnation_window=2, rolling_cycles=False)
    run = start(SOFTMAX, tmp_path / "run", config)
    ctx = make_context(run, evaluator=InstantEvaluator())
    yield runtime(ctx)
    ctx.store.close()


def initialised(rt) -> dict:
    return init_world_model({}, rt)


def a_cycle(rt) -> tuple[dict, dict]:
    """The main state after select_plans, and the first selected cycle's fresh state."""
    state = initialised(rt)
    state |= select_plans(state, rt)
    return state, fresh_cycle_state(state["selected"][0])


def test_init_world_model_measures_the_seed_and_plans_the_first_actions(rt):
    out = initialised(rt)
    wm = WorldModel.from_state(out["world_model"])
    assert wm.frontier() and out["iterations_done"] == 0 and out["last_node"] == "init_world_model"
    assert rt.context.evaluator.calls == ["seed"] and out["merged_cycles"] == ["seed"]
    assert out["best"]["attempt_id"] == "seed" and wm.nodes[ROOT].attachment.attempt_id == "seed"
    assert rt.context.store.get_attempt("seed")["status"] == "passed"


def test_select_plans_starts_a_cycle_on_a_frontier_action(rt):
    state = initialised(rt)
    out = select_plans(state, rt)
    assert out["stop_reason"] is None and out["cycle_seq"] == 1 and len(out["selected"]) == 1
    cycle = out["selected"][0]
    assert cycle["node_id"] in {n.id for n in WorldModel.from_state(out["world_model"]).frontier()}
    assert cycle["allowance"] == 4
    sends = launch_cycles(state | out)
    assert [type(s) for s in sends] == [Send] and sends[0].node == "action_cycle"


def test_select_plans_stops_when_the_budget_is_spent(rt):
    state = initialised(rt)
    rt.context.config.budget.iterations = 1
    rt.context.store.record_attempt(attempt_id="x1", cycle_id="c0", node_id=ROOT, prompt_kind="first",
                                    base_attempt_id=None, parent_attempt_id=None,
                                    source_hash=rt.context.store.put_source({"kernel.py": "x"}),
                                    result=EvalResult(status=Status.compile_error), eval_s=0.0)
    out = select_plans(state, rt)
    assert out["selected"] == [] and "budget" in out["stop_reason"]
    assert launch_cycles(state | out) == "finalize"


def test_instantiate_code_writes_a_pending_attempt_into_the_store(rt):
    _, cycle_state = a_cycle(rt)
    assert lane_start(cycle_state) == "instantiate_code"
    out = instantiate_code(cycle_state, rt)
    pending = out["pending"]
    assert pending["id"] and pending["source_hash"] and pending["prompt_kind"] == "first"
    assert rt.context.store.get_source(pending["source_hash"])  # the code is in the store, state holds its hash


def test_compile_and_bench_evaluates_the_pending_attempt(rt):
    _, cycle_state = a_cycle(rt)
    cycle_state |= instantiate_code(cycle_state, rt)
    out = compile_and_bench(cycle_state, rt)
    assert out["pending"] is None and out["n_attempts"] == 1
    assert out["last"]["id"] == cycle_state["pending"]["id"]
    assert rt.context.evaluator.calls[-1] == cycle_state["pending"]["id"]
    assert rt.context.store.get_attempt(out["last"]["id"])["status"] in {"passed", "incorrect_numerical"}


def test_reflect_gives_feedback_and_closes_a_stagnant_cycle(rt):
    _, cycle_state = a_cycle(rt)
    for _ in range(6):
        cycle_state |= instantiate_code(cycle_state, rt)
        cycle_state |= compile_and_bench(cycle_state, rt)
        out = reflect(cycle_state, rt)
        cycle_state |= out
        if continue_or_close(cycle_state) != "instantiate_code":
            break
    assert cycle_state["feedback"]
    assert cycle_state.get("stop") and continue_or_close(cycle_state) in {"next_cycle", "__end__"}
    finished = cycle_state["finished_cycles"]
    assert finished and finished[-1]["cycle_id"] == cycle_state["cycle"]["id"]


def run_cycle(rt, cycle_state: dict) -> dict:
    """instantiate_code -> compile_and_bench -> reflect until the cycle closes, as the cycle subgraph runs them."""
    while True:
        cycle_state |= instantiate_code(cycle_state, rt)
        cycle_state |= compile_and_bench(cycle_state, rt)
        cycle_state |= reflect(cycle_state, rt)
        if continue_or_close(cycle_state) != "instantiate_code":
            return cycle_state


def test_next_cycle_merges_a_rolling_lane_and_hands_it_the_next_action(tmp_path):
    # Room in the budget beyond the two lanes' shares once the first lane ends, so the merge can hand it another.
    config = SearchConfig(budget=Budget(iterations=20), stagnation_window=2, parallel_cycles=2)
    ctx = make_context(start(SOFTMAX, tmp_path / "run", config), evaluator=FlatEvaluator())
    rt = runtime(ctx)
    try:
        state = initialised(rt)
        state |= select_plans(state, rt)
        lanes = [fresh_cycle_state(c) for c in state["selected"]]
        assert len(lanes) == 2 and all(c["cycle"]["round"] for c in lanes)
        first = run_cycle(rt, lanes[0])
        assert continue_or_close(first) == "next_cycle"
        assert first["n_attempts"] < 10  # ended before its share: the budget has room
        out = next_cycle(first, rt)  # merged into the world model at once; the lane takes another action
        assert after_next_cycle(first | out) == "instantiate_code", out
        assert out["cycle"]["id"] not in {c["cycle"]["id"] for c in lanes}
        assert out["cycle"]["node_id"] not in {c["cycle"]["node_id"] for c in lanes}
        record = ctx.store.get_generation(f"merge:{first['cycle']['id']}")
        assert first["cycle"]["id"] in record["state"]["merged_cycles"]
    finally:
        ctx.store.close()


def test_update_world_model_merges_a_finished_cycle(rt):
    state, cycle_state = a_cycle(rt)
    cycle_state = run_cycle(rt, cycle_state)
    state["finished_cycles"] = cycle_state["finished_cycles"]
    out = update_world_model(state, rt)
    wm = WorldModel.from_state(out["world_model"])
    node = wm.nodes[cycle_state["cycle"]["node_id"]]
    assert node.kind == "closed" and out["finished_cycles"] == CLEAR
    assert out["iterations_done"] == cycle_state["n_attempts"]
    assert out["merged_cycles"][-1] == cycle_state["cycle"]["id"]
    assert out["best"]["score"] >= state["best"]["score"]


def test_finalize_records_why_the_search_stopped(rt):
    state = initialised(rt) | {"stop_reason": "iteration budget spent (4/4)"}
    out = finalize(state, rt)
    assert out["last_node"] == "finalize"
    assert rt.context.store.get_meta("status") == "finished"
