"""What the LLM is shown: every prompt kind rendered for the paper's tasks, and what each must contain.

The planner's and the coder's prompts are captured at the client (no endpoint); the world model, the evaluation
results and the speed-of-light figures are real objects of the project. The last test runs the real graph with a
scripted coder whose judgement reads the cycle's history.
"""

from __future__ import annotations

import re
import sys

import pytest
from conftest import REPO, SOFTMAX, insert, script

from ksearch_graph.config import LLMSettings
from ksearch_graph.llm import client as llm
from ksearch_graph.search.roles.llm_roles import LLMCoder, LLMPlanner
from ksearch_graph.search.roles.prompt_parts import compact_spec, performance_table
from ksearch_graph.search.roles.protocol import CodeRequest, Evidence
from ksearch_graph.search.world_model import Attachment, WorldModel, close_node
from ksearch_graph.search.world_model_edits import EditScript, apply_edits, parse_edit_script
from ksearch_graph.tasks.evaluation import EvalResult, Status, WorkloadResult
from ksearch_graph.tasks.speed_of_light import SpeedOfLight, task_work
from ksearch_graph.tasks.task import load_task

PAPER_TASKS = ["gqa_paged_decode_h32_kv4_d128_ps1", "mla_paged_decode_h16_ckv512_kpe64_ps1",
               "mla_paged_prefill_causal_h16_ckv512_kpe64_ps1",
               "moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048", "trimul", "softmax"]
H100 = "NVIDIA H100 80GB HBM3"
ANALYSIS = "ANALYSIS-MARKER: decode attention is memory-bound; split the KV length to fill 132 SMs."
KINDS = ["init", "update", "too_hard", "refill", "first", "debug", "improve"]


def _capture(monkeypatch) -> list:
    prompts: list = []

    def text(self, messages):
        prompts.append(messages)
        return "```python\nx = 1\n```", {}

    def structured(self, messages, schema):
        prompts.append(messages)
        return EditScript(), {}

    monkeypatch.setattr(llm.LLMClient, "text", text)
    monkeypatch.setattr(llm.LLMClient, "structured", structured)
    return prompts


def _result(task, scale: float) -> EvalResult:
    timed = [w.name for w in task.feedback_workloads() if w.timed]
    return EvalResult(status=Status.passed, score=10 / scale, latency_us=100 * scale, timing_representative=True,
                      environment={"device": "cuda", "gpu": H100},
                      workloads=[WorkloadResult(workload=n, correct=True, latency_us=100 * scale, reference_us=1000,
                                                speedup=10 / scale, baseline_us=150, speedup_vs_baseline=1.5 / scale)
                                 for n in timed])


def _tree() -> WorldModel:
    """A grown search: a closed chain of 3 and 14 frontier actions."""
    wm = WorldModel.new("task")
    ops = [{"op": "insert", "parent": "root", "action": {"title": f"family {i}", "description": f"family {i} " * 20,
                                                         "difficulty": 2, "value": 0.3, "predicted_gain": 1.3}}
           for i in range(8)]
    wm = apply_edits(wm, parse_edit_script({"analysis": ANALYSIS, "ops": ops}), max_new_nodes=8)
    for node in ("n1", "n9", "n11"):
        wm = apply_edits(wm, parse_edit_script({"ops": [insert(node, f"after {node} {j}", value=0.4,
                                                               description="x" * 290) for j in range(2)]}))
        wm = close_node(wm, node, Attachment(attempt_id=f"c{node}.1", source_hash="h", status="passed", score=2.0))
    return wm


def _render_all(monkeypatch, task, sol) -> dict[str, str]:
    prompts = _capture(monkeypatch)
    settings = LLMSettings(model="m", base_url="http://unused")
    planner, coder = LLMPlanner(settings, chat_model=object()), LLMCoder(settings, chat_model=object())
    wm = _tree()
    planner.initial(task, WorldModel.new(task.name), errors=[], sol=sol)
    attempts = [{"id": "c4.1", "prompt_kind": "first", "status": "compile_error", "score": 0, "latency_us": None,
                 "log": "Traceback (most recent call last):\n  File x\nSyntaxError: FIRST-ERROR"},
                {"id": "c4.2", "prompt_kind": "debug", "status": "passed", "score": 10, "latency_us": 100}]
    evidence = Evidence(node_id="n11", cycle_id="c4", passed=True, attempts=attempts, best=attempts[1] | {
        "source_hash": "h"}, best_files={"kernel.py": "BEST-CODE"}, parent_score=2.0, last_log="SyntaxError: bad",
        stop="stagnated", best_result=_result(task, 1), parent_result=_result(task, 2), last_failed_id="c4.1",
        last_failed_files={"kernel.py": "FAILING-CODE"})
    planner.after_cycle(task, wm, evidence, errors=[], sol=sol)
    failed = Evidence(**{**evidence.__dict__, "passed": False, "best": None, "best_files": None, "best_result": None})
    planner.too_hard(task, wm, failed, errors=[], sol=sol)
    planner.refill(task, wm, errors=[], sol=sol, best=("c4.2", _result(task, 1)))
    seed = {"kernel.py": task.seed_source or "SEED"}
    common = dict(task=task, node_id="n12", action={"title": "split-K", "description": "Split the KV length.",
                  "rationale": "fill the SMs"}, attempt_id="c5.3", analysis=ANALYSIS, sol=sol)
    history = [{"id": "c5.1", "prompt_kind": "first", "status": "compile_error", "score": 0, "latency_us": None,
                "log": "SyntaxError: HISTORY-ERROR-1", "derived_from": "seed"},
               {"id": "c5.2", "prompt_kind": "debug", "status": "incorrect_numerical", "score": 0,
                "latency_us": None, "log": "mismatch", "derived_from": "c5.1"}]
    files = [{"kernel.py": "a = 1\nb = 2\n"}, {"kernel.py": "a = 1\nb = 3  # TRIED-FIX\n"}]
    coder.write(CodeRequest(kind="first", base_files=seed, base_summary={"id": "seed", "score": 1.0},
                            last_files=None, last_summary=None, feedback="", **common))
    coder.write(CodeRequest(kind="debug", base_files=seed, base_summary={"id": "seed", "score": 1.0},
                            last_files={"kernel.py": "LAST-CODE"}, last_summary={"id": "c5.3", "status": "failed"},
                            feedback="RuntimeError: LAST-FAILURE", history=history + [history[-1] | {"id": "c5.3"}],
                            history_files=files + [{"kernel.py": "LAST-CODE"}], **common))
    coder.write(CodeRequest(kind="improve", base_files={"kernel.py": "CYCLE-BEST"}, base_summary={
        "id": "c5.2", "score": 10.0}, last_files=files[1], last_summary={"id": "c5.2", "status": "passed"},
        feedback=performance_table(_result(task, 1), sol), history=history, history_files=files,
        start_files=seed, start_summary={"id": "seed", "score": 1.0}, **common))
    return {kind: "\n".join(str(m.content) for m in messages) for kind, messages in zip(KINDS, prompts)}


@pytest.mark.parametrize("name", PAPER_TASKS)
def test_every_prompt_kind_carries_the_papers_context(monkeypatch, name):
    task = load_task(REPO / "examples" / name)
    sol = SpeedOfLight(H100, task_work(task))
    prompts = _render_all(monkeypatch, task, sol)
    sections = re.findall(r"^#{1,6} .+$", task.spec_text, re.MULTILINE)
    assert len(prompts) == len(KINDS) and len(sections) >= 2
    for kind, text in prompts.items():
        # The full spec (every section) and the reference, in every prompt: debug, improve and update included.
        assert task.spec_text.strip() in text and task.reference_source.strip() in text, kind
        assert all(s in text for s in sections), kind
        assert "H100 SXM" in text and "memory bandwidth 3.35 TB/s" in text, kind  # the GPU facts
        assert "floor us" in text, kind  # every workload's floor
        if kind != "init":
            assert ANALYSIS in text, kind  # the initial analysis, shown again
    wm = _tree()
    for kind in ("update", "refill"):  # the whole frontier the planner re-scores
        assert all(f'"id":"{n.id}"' in prompts[kind] for n in wm.frontier()), kind
    for kind in ("update", "too_hard", "refill", "improve"):  # per-workload latency against the others
        assert re.search(r"latency us +(parent us +)?reference us +baseline us", prompts[kind]), kind
        assert "% of floor" in prompts[kind] and "of the floor on H100 SXM" in prompts[kind], kind
    assert "FAILING-CODE" in prompts["too_hard"] and "SyntaxError: bad" in prompts["too_hard"]
    assert "BEST-CODE" in prompts["update"] and "FIRST-ERROR" in prompts["update"]
    assert "The frontier is weak" in prompts["refill"]
    # How to update after a cycle is in the planner's system message (every planner prompt's cached head); the
    # update itself names its node and its case last.
    assert all("# After each cycle\nWrite \"reflection\"" in prompts[k] for k in ("init", "update", "too_hard", "refill"))
    # tools/prompt_cache_share.py tells a too-hard update by this phrase: only the too-hard request may hold it.
    assert [k for k, text in prompts.items() if "was too hard as stated" in text] == ["too_hard"]
    tail = prompts["update"].split("# What to do now")[-1]
    assert 'Write "reflection" about node n11.' in tail
    assert "node n11 is now closed" in prompts["update"] and "n11 was too hard as stated" in prompts["too_hard"]
    # The coder reads its history: earlier failures and the change each made.
    assert "HISTORY-ERROR-1" in prompts["debug"] and "+b = 3  # TRIED-FIX" in prompts["debug"]
    assert "HISTORY-ERROR-1" in prompts["improve"] and "LAST-FAILURE" in prompts["debug"]


def test_prompts_of_one_run_share_a_stable_prefix(monkeypatch):
    """Everything up to the analysis is the same text in every planner (and every coder) prompt of a run, so a
    provider's prompt cache can reuse it; what changes comes after."""
    task = load_task(REPO / "examples" / PAPER_TASKS[0])
    prompts = _render_all(monkeypatch, task, SpeedOfLight(H100, task_work(task)))
    planner = [prompts[k] for k in ("update", "too_hard", "refill")]
    coder = [prompts[k] for k in ("first", "debug", "improve")]
    for group in (planner, coder):
        end = group[0].index(ANALYSIS) + len(ANALYSIS)
        assert all(p[:end] == group[0][:end] for p in group)
        assert end / max(len(p) for p in group) > 0.6  # tools/prompt_cache_share.py measures real runs
    # A cycle's coder prompts also share the action and the code the cycle started from; improve shows its best
    # version after them.
    start = prompts["first"].split("# What to do now")[0]
    assert "# Start from this code" in start and all(p.startswith(start) for p in coder)
    assert "CYCLE-BEST" in prompts["improve"].removeprefix(start)
    assert prompts["init"].split("# GPU and speed of light")[1].split("\n\n")[0] in prompts["update"]


def test_compact_spec_keeps_every_section():
    task = load_task(REPO / "examples" / PAPER_TASKS[0])
    compact = compact_spec(task.spec_text, 3000)
    assert len(compact) <= 3000
    for heading in re.findall(r"^#{1,6} .+$", task.spec_text, re.MULTILINE):
        assert heading in compact
    assert compact_spec("short", 3000) == "short"


def test_a_cpu_run_says_its_timings_are_not_gpu_numbers(monkeypatch):
    task = load_task(SOFTMAX)
    prompts = _capture(monkeypatch)
    LLMPlanner(LLMSettings(model="m", base_url="http://x"), chat_model=object()).initial(
        task, WorldModel.new("softmax"), errors=[], sol=SpeedOfLight("cpu", task_work(task)))
    text = str(prompts[0][1].content)
    assert "no GPU" in text and "floor us" not in text and "38.4 KB" in text  # the work, without a floor
    assert "@triton.autotune fails there" in text  # every call of an autotuned kernel fails in the interpreter


# ------------------------------------------------------------------------------------------------ the graph

FIXES = {  # a broken softmax, and three fixes the scripted coder knows, in the order it would try them
    "broken": "    return x.exp() / x.exp().sum(-1, keepdim=True)  # overflows\n",
    "clamp": "    return x.clamp(-80, 80).exp() / x.clamp(-80, 80).exp().sum(-1, keepdim=True)  # fix: clamp\n",
    "double": "    e = x.double().exp()\n    return (e / e.sum(-1, keepdim=True)).float()  # fix: double\n",
    "max": "    e = (x - x.amax(-1, keepdim=True)).exp()\n    return e / e.sum(-1, keepdim=True)  # fix: max\n",
}


def _kernel(body: str) -> str:
    return f"```python\nimport torch\n\n\ndef softmax(x):\n{body}```\n"


@pytest.mark.slow
def test_the_coder_does_not_repeat_a_fix_that_already_failed(tmp_path, scripted):
    """A scripted coder whose judgement is only "take the first fix I know that this prompt does not show as
    tried": with the cycle's history in the prompt it tries clamp, then double, then max (which works). Without the
    history, the third prompt would show only the last failure (double) and it would try clamp again."""
    from ksearch_graph.app.runs import drive, start
    from ksearch_graph.config import Budget, SearchConfig
    from ksearch_graph.search.context import make_context

    def next_fix(messages) -> str:
        prompt = str(messages[-1].content)
        for name in ("clamp", "double", "max"):
            if f"# fix: {name}" not in prompt:
                return _kernel(FIXES[name])
        raise AssertionError("every fix was shown as tried")

    settings = LLMSettings(model="scripted", backoff_s=0.01, max_retries=1)
    scripted.planner += [script([insert("root", f"idea {i}", value=0.9 - 0.3 * i) for i in range(3)], reflect=False,
                                analysis=ANALYSIS),
                         script([insert("n1", "next")])]
    scripted.coder += [_kernel(FIXES["broken"]), next_fix, next_fix, next_fix]
    cfg = SearchConfig(budget=Budget(iterations=4), stagnation_window=4, planner="llm", planner_llm=settings,
                       coder_llm=settings, confirm_new_best=False)
    run = start(SOFTMAX, tmp_path / "run", cfg)
    ctx = make_context(run, planner=LLMPlanner(settings, scripted), coder=LLMCoder(settings, scripted))
    drive(run, ctx, fresh=True)
    rows = [r for r in ctx.store.attempts() if r["prompt_kind"] != "seed"]
    tried = [next((n for n in ("clamp", "double", "max") if f"# fix: {n}" in str(ctx.store.get_source(
        r["source_hash"]))), "broken") for r in rows]
    assert tried == ["broken", "clamp", "double", "max"]
    assert [r["status"] for r in rows][:3] == ["incorrect_numerical"] * 3 and rows[3]["status"] == "passed"
    last_prompt = str(scripted.seen["coder"][3][-1].content)
    assert "earlier attempts" in last_prompt and "+    return x.clamp(-80, 80)" in last_prompt
    # Every prompt and raw answer is in the run directory, under the attempt it produced.
    recorded = ctx.store.exchanges("c1.4:code")[0]["transcript"][0]
    assert recorded["messages"][-1]["content"] == last_prompt and "# fix: max" in recorded["answer"]


@pytest.mark.parametrize("name", ["moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048", "trimul"])
def test_a_whole_search_keeps_seventy_percent_of_each_prompt_in_a_stable_prefix(tmp_path, name):
    """tools/prompt_cache_share.py's measurement, on the two tasks whose code is largest and smallest against
    their spec: every call's prefix that stays the same across the run's calls of its role is at least 70% of
    it; a cache serves every coder call that much; only a run's first planner update (the first prompt with the
    analysis in it) shares less with the calls before it."""
    sys.path.insert(0, str(REPO / "tools"))
    from prompt_cache_share import measure, run_synthetic

    _, ctx = run_synthetic(REPO / "examples" / name, tmp_path / "run", iterations=30)
    try:
        figures = measure(ctx.store)
    finally:
        ctx.store.close()
    kinds = figures["kinds"]
    assert {"first", "debug", "improve", "update"} <= kinds.keys()
    assert figures["stable_at_least_70"] == 1.0, kinds
    assert all(kinds[k]["shared_min"] >= 0.7 for k in ("first", "debug", "improve")), kinds
    assert kinds["update"]["shared_median"] >= 0.7, kinds
