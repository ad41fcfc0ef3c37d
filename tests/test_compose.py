"""The search composed into other graphs: as a subgraph node (with interrupts reaching the parent) and as a tool."""

from __future__ import annotations

from typing import TypedDict

import pytest
from conftest import SOFTMAX
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command

from ksearch_graph.app.compose import kernel_search_node, optimize_kernel

pytestmark = pytest.mark.slow  # runs searches as subgraphs and tools


class Parent(TypedDict, total=False):
    task_dir: str
    run_dir: str
    kernel_search: dict
    report: str


def _parent(options: dict):
    g = StateGraph(Parent)
    g.add_node("search", kernel_search_node(options=options))
    g.add_node("report", lambda s: {"report": f"best {s['kernel_search']['attempt_id']}"})
    g.add_edge(START, "search")
    g.add_edge("search", "report")
    g.add_edge("report", END)
    return g.compile(checkpointer=InMemorySaver())


def test_search_as_a_subgraph_node(tmp_path):
    parent = _parent({"budget": {"iterations": 1}})
    out = parent.invoke({"task_dir": str(SOFTMAX), "run_dir": str(tmp_path / "sub")},
                        {"configurable": {"thread_id": "p1"}})
    result = out["kernel_search"]
    assert result["attempt_id"] and result["score"] > 0 and "kernel.py" in result["files"]
    assert out["report"] == f"best {result['attempt_id']}"


def test_an_interrupt_inside_the_search_pauses_the_parent(tmp_path):
    parent = _parent({"budget": {"iterations": 1}, "approve_plans": True})
    config = {"configurable": {"thread_id": "p2"}}
    out = parent.invoke({"task_dir": str(SOFTMAX), "run_dir": str(tmp_path / "sub")}, config)
    assert "__interrupt__" in out and out["__interrupt__"][0].value["question"] == "approve_plan"
    out = parent.invoke(Command(resume={"decision": "stop"}), config)
    assert out["kernel_search"]["stop_reason"] == "stopped by the user"
    assert out["report"].startswith("best ")


def test_optimize_kernel_tool_runs_and_continues_a_search(tmp_path):
    run_dir = str(tmp_path / "tool")
    first = optimize_kernel.invoke({"task_dir": str(SOFTMAX), "run_dir": run_dir, "iterations": 1})
    assert first["run_dir"] == run_dir and first["thread_id"] and first["files"]
    again = optimize_kernel.invoke({"task_dir": str(SOFTMAX), "run_dir": run_dir, "iterations": 2})
    assert again["thread_id"] == first["thread_id"]  # the same search, continued
    from ksearch_graph.rundir.run_dir import RunDir

    store = RunDir.open(run_dir).store()
    assert store.count_attempts() == 2
    store.close()
    assert "iterations" in optimize_kernel.args and "task_dir" in optimize_kernel.description + str(optimize_kernel.args)


def test_coding_agent_writes_an_op_searches_it_and_reports(tmp_path, monkeypatch, scripted):
    """examples/kernel_agent: the agent's judgement is scripted; the tools, the search (through the real
    OpenAI client against a local server) and the evaluator are real."""
    import json
    import sys

    from conftest import REPO, FakeOpenAIServer, Reply, insert, script
    from langchain_core.messages import AIMessage

    sys.path.insert(0, str(REPO / "examples" / "kernel_agent"))
    import agent as kernel_agent

    monkeypatch.chdir(tmp_path)
    reference = (
        "import torch\n\n\ndef make_inputs(params, seed, device):\n"
        "    g = torch.Generator().manual_seed(seed)\n    n = params['n']\n"
        "    return torch.randn(n, n, generator=g).to(device), torch.randn(n, n, generator=g).to(device)\n\n\n"
        "def reference(x, y):\n    return torch.nn.functional.gelu(x) * y\n")
    faster = "```python\nimport torch\n\n\ndef kernel(x, y):\n    return torch.nn.functional.gelu(x).mul_(y)\n```"
    search_replies = [Reply.json(json.loads(script([insert("root", f"idea {i}") for i in range(3)], reflect=False))),
                      Reply.content(faster), Reply.json(json.loads(script([insert("n1", "next")])))]
    with FakeOpenAIServer(search_replies) as server:
        scripted.coder += [
            AIMessage(content="", tool_calls=[{"id": "1", "name": "write_kernel_task", "args": {
                "name": "gelu_mul", "spec": "GELU(x) * y, fp32 [n, n]", "reference_code": reference,
                "workloads": [{"name": "64", "params": {"n": 64}}]}}]),
            # Reacts to the first tool's result: the task folder it wrote.
            lambda messages: AIMessage(content="", tool_calls=[{"id": "2", "name": "optimize_kernel", "args": {
                "task_dir": str(messages[-1].content), "run_dir": "runs/kernel_agent/gelu_mul", "iterations": 1,
                "model": "fake-model", "base_url": server.base_url}}]),
            "The best kernel is c1.1.",
        ]
        out = kernel_agent.make_agent(scripted).invoke({"messages": [("user", "fast gelu(x)*y please")]})
        assert server.remaining == 0
    tool_results = [m for m in out["messages"] if m.type == "tool"]
    assert tool_results[0].content.endswith("gelu_mul")
    result = json.loads(tool_results[1].content)
    assert result["attempt_id"] in ("c1.1", "seed") and result["score"] > 0 and result["files"]
    assert out["messages"][-1].content == "The best kernel is c1.1."



def test_subgraph_with_an_llm_planner_and_coder(tmp_path):
    """The same subgraph node with the LLM path: scripted answers through the real client and HTTP."""
    import json

    from conftest import FakeOpenAIServer, Reply, insert, kernel_answer, script

    from ksearch_graph.tasks.task import load_task

    replies = [Reply.json(json.loads(script([insert("root", f"idea {i}") for i in range(3)], reflect=False))),
               Reply.content(kernel_answer(load_task(SOFTMAX), BLOCK_N=512)),
               Reply.json(json.loads(script([insert("n1", "next")])))]
    with FakeOpenAIServer(replies) as server:
        llm = {"model": "fake-model", "base_url": server.base_url}
        parent = _parent({"budget": {"iterations": 1}, "planner": "llm", "planner_llm": llm, "coder_llm": llm})
        out = parent.invoke({"task_dir": str(SOFTMAX), "run_dir": str(tmp_path / "sub")},
                            {"configurable": {"thread_id": "p3"}})
        assert server.remaining == 0
    assert out["kernel_search"]["stop_reason"].startswith("iteration budget")
    assert "BLOCK_N = 512" in out["kernel_search"]["files"]["kernel.py"] or out["kernel_search"]["attempt_id"] == "seed"
