"""Every path of the search graph, with a scripted chat model standing in for the LLM's judgement.

Everything else is real: the LLM planner/coder with their prompts and parsers, the LangGraph graph
with the SQLite checkpointer, the run store, and the subprocess evaluator running Triton kernels in
the interpreter on the softmax example.
"""

from __future__ import annotations

import json

import openai
import pytest
from conftest import SOFTMAX, insert, kernel_answer, script

from ksearch_graph.app.runs import drive, start
from ksearch_graph.config import Budget, SearchConfig
from ksearch_graph.llm.client import EndpointUnavailable, LLMSettings
from ksearch_graph.reports.run_view import history, state_at, summary
from ksearch_graph.search.context import make_context
from ksearch_graph.search.roles.llm_roles import LLMCoder, LLMPlanner
from ksearch_graph.search.world_model import WorldModel

pytestmark = pytest.mark.slow  # every test runs the whole search graph with a real store and checkpointer

SETTINGS = LLMSettings(model="scripted", backoff_s=0.01, max_retries=2)


def _run(tmp_path, scripted, *, iterations=3, window=2, k=1, name="run", **config):
    cfg = SearchConfig(budget=Budget(iterations=iterations), stagnation_window=window, parallel_cycles=k,
                       planner="llm", planner_llm=SETTINGS, coder_llm=SETTINGS, **config)
    run = start(SOFTMAX, tmp_path / name, cfg)
    events: list[dict] = []
    ctx = make_context(run, planner=LLMPlanner(SETTINGS, scripted), coder=LLMCoder(SETTINGS, scripted))
    return run, ctx, events


def _drive(run, ctx, events, fresh=True, answer=None):
    return drive(run, ctx, fresh=fresh and answer is None, on_event=events.append, answer=answer)


def _init(n=3):
    return script([insert("root", f"idea {i}", value=0.9 - 0.1 * i) for i in range(n)], reflect=False,
                  analysis="row softmax is memory bound")


def test_passing_cycle_closes_node_and_update_extends_tree(tmp_path, scripted, softmax_task):
    good = kernel_answer(softmax_task, VARIANT="online", BLOCK_N=256)
    scripted.planner += [_init(), script([insert("n1", "continue n1")])]
    scripted.coder += [good, kernel_answer(softmax_task, VARIANT="online", BLOCK_N=512), good]
    run, ctx, events = _run(tmp_path, scripted, iterations=3, window=2)
    final = _drive(run, ctx, events)

    wm = WorldModel.from_state(final["world_model"])
    n1 = wm.nodes["n1"]
    assert n1.kind == "closed" and n1.attachment is not None and n1.visits == 1 and n1.failures == 0
    assert any(note.startswith("CURRENT:") for note in n1.beliefs.notes)  # the reflection was written
    assert [n.action.title for n in wm.children("n1")] == ["continue n1"]
    rows = ctx.store.attempts()
    kinds = [r["prompt_kind"] for r in rows if r["prompt_kind"] != "seed"]
    assert kinds == ["first", "improve", "improve"]
    assert all(r["status"] == "passed" for r in rows)
    assert final["iterations_done"] == 3 and final["best"]["attempt_id"] in {r["id"] for r in rows}
    # The improve prompt carried the cycle-best code and the performance feedback.
    improve_prompt = str(scripted.seen["coder"][1][-1].content)
    assert "best version of this cycle" in improve_prompt and "reference us" in improve_prompt
    assert "earlier attempts" not in improve_prompt or "c1.1" in improve_prompt  # the history of the cycle
    tokens = ctx.store.token_totals()["per_role"]
    assert tokens["planner"]["prompt_tokens"] > 0 and tokens["coder"]["completion_tokens"] > 0
    assert ctx.store.get_meta("status") == "finished"
    assert (run.path / "best" / "kernel.py").is_file()


def test_failing_cycle_gets_too_hard_update_and_debug_prompts(tmp_path, scripted, softmax_task):
    broken = "```python\ndef softmax(x:\n    return x\n```"
    wrong = kernel_answer(softmax_task, VARIANT="single_pass", BLOCK_N=64)  # too short a block: wrong answers
    scripted.planner += [_init(), script([{"op": "update", "node": "n1", "value": 0.1, "difficulty": 4}])]
    scripted.coder += [broken, wrong]
    run, ctx, events = _run(tmp_path, scripted, iterations=2, window=2)
    final = _drive(run, ctx, events)

    statuses = [r["status"] for r in ctx.store.attempts() if r["prompt_kind"] != "seed"]
    assert statuses == ["compile_error", "incorrect_numerical"]
    debug_prompt = str(scripted.seen["coder"][1][-1].content)
    assert "failed" in debug_prompt and "compile_error" in debug_prompt
    wm = WorldModel.from_state(final["world_model"])
    n1 = wm.nodes["n1"]
    assert n1.kind == "open" and n1.failures == 1 and n1.action.value == 0.1 and n1.action.difficulty == 4
    too_hard_prompt = str(scripted.seen["planner"][1][-1].content)
    assert "too hard" in too_hard_prompt
    assert final["best"]["attempt_id"] == "seed"  # nothing beat the seed


def test_too_hard_prune_removes_action(tmp_path, scripted, softmax_task):
    scripted.planner += [_init(), script([{"op": "prune", "node": "n1", "reason": "wrong idea"}])]
    scripted.coder += ["no code here, sorry"]
    run, ctx, events = _run(tmp_path, scripted, iterations=1, window=1)
    final = _drive(run, ctx, events)
    wm = WorldModel.from_state(final["world_model"])
    assert "n1" not in wm.nodes and {"n2", "n3"} <= set(wm.nodes)
    row = [r for r in ctx.store.attempts() if r["prompt_kind"] != "seed"][0]
    assert row["status"] == "compile_error" and "no usable code" in row["log_excerpt"]


def test_malformed_json_is_repaired_and_rejected_edits_are_fed_back(tmp_path, scripted, softmax_task):
    too_many = script([insert("n1", f"x{i}") for i in range(4)])  # breaks the 3-new-nodes rule
    scripted.planner += [
        "I think the plan is {not json at all",  # repaired by the LLM client's validation feedback
        _init(),
        too_many,  # rejected by the world model's invariants: errors go back to the planner
        script([insert("n1", "ok")]),
    ]
    scripted.coder += [kernel_answer(softmax_task)]
    run, ctx, events = _run(tmp_path, scripted, iterations=1, window=1)
    final = _drive(run, ctx, events)
    retry_prompt = str(scripted.seen["planner"][3][-1].content)
    assert "REJECTED" in retry_prompt and "at most 3" in retry_prompt
    wm = WorldModel.from_state(final["world_model"])
    assert [n.action.title for n in wm.children("n1")] == ["ok"]


def test_edit_rejected_after_all_retries_falls_back_to_a_continuation(tmp_path, scripted, softmax_task):
    bad = script([{"op": "prune", "node": "root"}])
    scripted.planner += [_init(), bad, bad, bad]
    scripted.coder += [kernel_answer(softmax_task)]
    run, ctx, events = _run(tmp_path, scripted, iterations=1, window=1, max_edit_retries=2)
    final = _drive(run, ctx, events)
    assert any(e["event"] == "edit_rejected" for e in events)
    wm = WorldModel.from_state(final["world_model"])
    assert wm.nodes["n1"].kind == "closed" and len(wm.children("n1")) == 1  # the automatic continuation


def test_transient_api_errors_are_retried(tmp_path, scripted, softmax_task):
    request = __import__("httpx").Request("POST", "http://x/v1/chat/completions")
    scripted.planner += [openai.APIConnectionError(request=request), _init(), script([insert("n1", "next")])]
    scripted.coder += [openai.APIConnectionError(request=request), kernel_answer(softmax_task)]
    run, ctx, events = _run(tmp_path, scripted, iterations=1, window=1)
    final = _drive(run, ctx, events)
    assert final["iterations_done"] == 1 and final["stop_reason"].startswith("iteration budget")


def test_dead_endpoint_pauses_and_resume_continues_exactly(tmp_path, scripted, softmax_task):
    request = __import__("httpx").Request("POST", "http://x/v1/chat/completions")
    dead = [openai.APIConnectionError(request=request)] * 3  # max_retries=2: three failures -> unavailable
    good = kernel_answer(softmax_task, VARIANT="online", BLOCK_N=256)
    scripted.planner += [_init()]
    scripted.coder += [good, *dead]
    run, ctx, events = _run(tmp_path, scripted, iterations=3, window=3)
    with pytest.raises(EndpointUnavailable):
        _drive(run, ctx, events)
    assert [r["id"] for r in ctx.store.attempts()] == ["seed", "c1.1"]
    # The endpoint is back: resume from the checkpoint, nothing evaluated is lost or repeated.
    scripted.coder += [good, kernel_answer(softmax_task, VARIANT="online", BLOCK_N=512)]
    scripted.planner += [script([insert("n1", "next")])]
    final = _drive(run, ctx, events, fresh=False)
    assert [r["id"] for r in ctx.store.attempts()] == ["seed", "c1.1", "c1.2", "c1.3"]
    assert final["iterations_done"] == 3


def test_parallel_cycles_are_merged_by_one_update(tmp_path, scripted, softmax_task):
    scripted.planner += [_init(), script([insert("n1", "after n1")]), script([insert("n2", "after n2")])]
    scripted.coder += [kernel_answer(softmax_task, BLOCK_N=b) for b in (128, 256, 512, 1024)]
    run, ctx, events = _run(tmp_path, scripted, iterations=4, window=5, k=2, rolling_cycles=False)
    final = _drive(run, ctx, events)
    wm = WorldModel.from_state(final["world_model"])
    assert wm.nodes["n1"].kind == "closed" and wm.nodes["n2"].kind == "closed"
    assert final["iterations_done"] == 4 and sorted(final["merged_cycles"]) == ["c1", "c2", "seed"]
    started = [e for e in events if e["event"] == "cycle_started"]
    assert [e["allowance"] for e in started] == [2, 2]
    # One world-model update superstep merged both cycles.
    assert [r["node"] for r in history(run)].count("update_world_model") == 1


def test_token_cap_stops_the_search(tmp_path, scripted, softmax_task):
    scripted.planner += [_init()]
    scripted.coder += [kernel_answer(softmax_task)] * 5
    cfg_run, ctx, events = _run(tmp_path, scripted, iterations=5, window=5, name="capped")
    ctx.config.budget.max_tokens = 1  # the init call alone spends more
    final = _drive(cfg_run, ctx, events)
    assert "token budget" in final["stop_reason"]
    assert final["iterations_done"] == 0 and ctx.store.get_meta("status") == "finished"


def test_summary_json_fields(tmp_path, scripted, softmax_task):
    scripted.planner += [_init(), script([insert("n1", "next")])]
    scripted.coder += [kernel_answer(softmax_task)]
    run, ctx, events = _run(tmp_path, scripted, iterations=1, window=1)
    _drive(run, ctx, events)
    info = summary(run)
    assert info["iterations_done"] == 1 and info["attempts"] == 1
    assert set(info["best"]) == {"attempt_id", "score", "latency_us", "node_id", "speed_of_light"}
    assert info["best"]["speed_of_light"] is None  # CPU timings: no floor
    assert info["tokens"]["total_tokens"] > 0
    json.dumps(info)


def test_token_cap_ends_a_running_cycle(tmp_path, scripted, softmax_task):
    good = kernel_answer(softmax_task)
    run, ctx, events = _run(tmp_path, scripted, iterations=5, window=5)

    def coder_then_cap(messages):
        ctx.config.budget.max_tokens = ctx.store.token_totals()["total_tokens"] + 1  # this call crosses it
        return good

    scripted.planner += [_init(), script([insert("n1", "next")])]
    scripted.coder += [coder_then_cap]
    final = _drive(run, ctx, events)
    assert final["iterations_done"] == 1 and "token budget" in final["stop_reason"]
    finished = [e for e in events if e["event"] == "cycle_finished"]
    assert "token budget" in finished[0]["reason"]


def test_wall_clock_cap_counts_time_spent_across_the_run(tmp_path, scripted, softmax_task):
    scripted.planner += [_init()]
    run, ctx, events = _run(tmp_path, scripted, iterations=5, window=5)
    ctx.config.budget.max_wall_s = 0.5  # the seed's evaluation alone takes longer
    final = _drive(run, ctx, events)
    assert "time budget" in final["stop_reason"] and final["iterations_done"] == 0


def test_a_cap_reached_during_a_refill_stops_the_search_without_another_call(tmp_path, scripted, softmax_task):
    """The refill's first answer is rejected and its call crosses the token cap: no retry is asked, no cycle starts."""
    run, ctx, events = _run(tmp_path, scripted, iterations=3, window=3)
    weak = script([insert("root", f"weak {i}", value=0.4 - 0.1 * i) for i in range(3)], reflect=False)

    def rejected_then_cap(messages):
        ctx.config.budget.max_tokens = ctx.store.token_totals()["total_tokens"] + 1  # this call crosses it
        return script([insert("n9", "no such parent")], reflect=False)

    scripted.planner += [weak, rejected_then_cap]
    final = _drive(run, ctx, events)
    assert "token budget" in final["stop_reason"] and final["iterations_done"] == 0
    assert len(scripted.seen["planner"]) == 2 and not scripted.seen.get("coder")


def test_branch_forgets_the_source_runs_later_cycles(tmp_path, scripted, softmax_task):
    """A branch re-uses cycle ids (c2 again); it must not replay the source's cached code or planner answers."""
    from ksearch_graph.app.runs import branch

    good = kernel_answer(softmax_task)
    scripted.planner += [_init(), script([insert("n1", "after c1")]), script([insert("n2", "after c2")])]
    scripted.coder += [good, "no code", kernel_answer(softmax_task, BLOCK_N=512)]
    run, ctx, events = _run(tmp_path, scripted, iterations=3, window=1)
    _drive(run, ctx, events)
    at = next(r for r in history(run) if r["node"] == "update_world_model")  # after c1, before c2
    new = branch(run.path, at["checkpoint"], tmp_path / "branch")
    store = new.store()
    assert [a["id"] for a in store.attempts()] == ["seed", "c1.1", "c1.2"]
    assert store.get_generation("c2.1:code") is None and store.get_generation("update:c2:0") is None
    assert store.get_generation("c1.1:code") is not None
    store.close()


def test_plan_approval_pick_edit_stop_and_bad_answers(tmp_path, scripted, softmax_task):
    from ksearch_graph.app.runs import pending_question

    scripted.planner += [_init(), script([insert("n2", "after n2")]), script([{"op": "update", "node": "n1", "value": 0.2}])]
    scripted.coder += [kernel_answer(softmax_task), "no code", "no code"]
    run, ctx, events = _run(tmp_path, scripted, iterations=4, window=1, approve_plans=True)
    _drive(run, ctx, events)
    q = pending_question(run)
    assert q["question"] == "approve_plan" and q["node_id"] == "n1" and {f["id"] for f in q["frontier"]} == {"n1", "n2", "n3"}
    assert ctx.store.count_attempts() == 0  # nothing is implemented before the answer

    _drive(run, ctx, events, answer={"decision": "pick", "node_id": "nope"})  # not on the frontier: asked again
    assert "not an open action" in pending_question(run)["problem"]
    _drive(run, ctx, events, answer={"decision": "maybe"})  # malformed: asked again
    assert "not usable" in pending_question(run)["problem"]
    _drive(run, ctx, events, answer={"decision": "pick", "node_id": "n2"})  # runs a cycle on n2
    assert pending_question(run)["node_id"] == "n1"
    _drive(run, ctx, events, answer={"decision": "edit", "action": {"title": "n1, edited by hand"}})
    wm = WorldModel.from_state(state_at(run)["world_model"])
    assert wm.nodes["n2"].kind == "closed" and wm.nodes["n1"].action.title == "n1, edited by hand"
    final = _drive(run, ctx, events, answer={"decision": "stop"})
    assert final["stop_reason"] == "stopped by the user" and pending_question(run) is None
    assert [a["node_id"] for a in ctx.store.attempts() if a["prompt_kind"] != "seed"] == ["n2", "n2", "n1"]


def test_store_is_safe_under_concurrent_writers(tmp_path):
    """Parallel cycles and the progress view share one store connection from several threads."""
    import threading

    from ksearch_graph.rundir.store import RunStore
    from ksearch_graph.tasks.evaluation import EvalResult, Status

    store = RunStore(tmp_path / "store.sqlite")
    errors = []

    def work(worker: int):
        try:
            for i in range(60):
                store.record_llm_call("coder", "code", {"prompt_tokens": 1}, 0.0)
                store.record_attempt(attempt_id=f"c{worker}.{i}", cycle_id=f"c{worker}", node_id="n1",
                                     prompt_kind="first", base_attempt_id=None, parent_attempt_id=None,
                                     source_hash=store.put_source({"k.py": f"{worker}-{i}"}),
                                     result=EvalResult(status=Status.passed, score=1.0))
                store.token_totals()
                store.log_event("attempt", i=i)
        except Exception as e:  # noqa: BLE001 - any error is the failure we look for
            errors.append(e)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert store.count_attempts() == 240 and store.token_totals()["per_role"]["coder"]["calls"] == 240


def test_a_weak_frontier_is_refilled_before_the_cycle_starts(tmp_path, scripted, softmax_task):
    """The reference's refill step: no action valued above 0.5, so the planner is asked for new ones first, and the
    cycle implements the best of them. The answer is recorded like every planner call."""
    weak = script([insert("root", f"weak {i}", value=0.4 - 0.1 * i) for i in range(3)], reflect=False)
    refill = script([insert("root", "refilled", value=0.9)], reflect=False)
    scripted.planner += [weak, refill, script([insert("n4", "continue")])]
    scripted.coder += [kernel_answer(softmax_task, VARIANT="online", BLOCK_N=256)]
    run, ctx, events = _run(tmp_path, scripted, iterations=1, window=1)
    final = _drive(run, ctx, events)
    refill_prompt = str(scripted.seen["planner"][1][-1].content)
    assert "refill the frontier" in refill_prompt and "The frontier is weak" in refill_prompt
    assert all(f'"id":"n{i}"' in refill_prompt for i in (1, 2, 3))
    wm = WorldModel.from_state(final["world_model"])
    assert wm.nodes["n4"].action.title == "refilled" and wm.nodes["n4"].kind == "closed"
    assert ctx.store.get_generation("refill:c1:0") is not None
    assert [e["key"] for e in ctx.store.exchanges("refill:")] == ["refill:c1:0"]
    assert any(e["data"]["phase"] == "refill before c1" for e in ctx.store.events("world_model"))


def test_a_failing_lane_ends_the_lanes_waiting_for_it(tmp_path, scripted, softmax_task):
    """Rolling lanes, one action within the difficulty cap for two lanes: the second waits for the first's merge. The
    first lane's endpoint dies; the run must stop with that error (not wait forever for a merge that cannot come),
    and a resume finishes the budget."""
    import threading

    request = __import__("httpx").Request("POST", "http://x/v1/chat/completions")
    hard = [insert("root", f"hard {i}", value=0.8, difficulty=5) for i in range(2)]
    scripted.planner += [script([insert("root", "the only easy idea", value=0.9, difficulty=1), *hard],
                                reflect=False, analysis="row softmax is memory bound")]
    scripted.coder += [openai.APIConnectionError(request=request)] * 3  # max_retries=2: the endpoint is dead
    run, ctx, events = _run(tmp_path, scripted, iterations=2, window=2, k=2, difficulty_cap=2)
    outcome: dict = {}

    def go():
        try:
            outcome["final"] = _drive(run, ctx, events)
        except BaseException as e:  # noqa: BLE001 (what the run raised is the test's subject)
            outcome["error"] = e

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(timeout=120)
    assert not t.is_alive(), "the run never ended: a lane waits for a merge that cannot come"
    assert isinstance(outcome.get("error"), EndpointUnavailable), outcome
    round_start = [r for r in ctx.store.generations_with_prefix("round:")]
    assert round_start and round_start[0]["payload"]["waiting"], round_start  # the second lane did wait
    # The endpoint is back: resume, and the search spends its budget.
    scripted.coder += [kernel_answer(softmax_task, VARIANT="online", BLOCK_N=256),
                       kernel_answer(softmax_task, VARIANT="online", BLOCK_N=512)]
    scripted.planner += [script([insert("root", f"next {i}", difficulty=1)]) for i in range(8)]
    final = _drive(run, ctx, events, fresh=False)
    assert final["iterations_done"] == 2
