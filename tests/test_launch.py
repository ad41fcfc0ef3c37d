"""Searches started from inside other programs are launched as `ksearch run` and `ksearch resume` launch them
(app/launch.py): the LangChain tool and a parent graph's search node refuse a broken task before a run directory is
written, and the tool continues a finished search with a larger budget as `ksearch resume --iterations N` does."""

from __future__ import annotations

import json
import shutil
import sqlite3
from contextlib import closing
from typing import TypedDict

import pytest
from conftest import SOFTMAX
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph

from ksearch_graph.app.compose import kernel_search_node, optimize_kernel
from ksearch_graph.app.preflight import PreflightFailed
from ksearch_graph.tasks.task import TaskError


@pytest.fixture
def broken_seed(tmp_path):
    """examples/softmax with a seed that runs but is wrong (it leaves out the softmax's division)."""
    task = tmp_path / "broken"
    shutil.copytree(SOFTMAX, task)
    seed = (task / "seed.py").read_text()
    assert "e / tl.sum(e, axis=0)" in seed
    (task / "seed.py").write_text(seed.replace("e / tl.sum(e, axis=0)", "e"))
    return task


def test_the_tool_refuses_a_folder_that_is_no_task_with_the_clis_error(tmp_path):
    with pytest.raises(TaskError, match="is not a task folder: it has no task.json"):
        optimize_kernel.invoke({"task_dir": str(tmp_path / "nothing"), "run_dir": str(tmp_path / "run")})
    assert not (tmp_path / "run").exists()


def test_the_tool_preflights_the_task_and_writes_nothing_when_its_seed_fails(broken_seed, tmp_path):
    with pytest.raises(PreflightFailed, match="task softmax: its seed does not pass in the harness") as refused:
        optimize_kernel.invoke({"task_dir": str(broken_seed), "run_dir": str(tmp_path / "run"), "iterations": 1})
    assert refused.value.task  # the task's failure, not the pool's
    assert not (tmp_path / "run").exists() and not list(tmp_path.glob(".run.new-*"))


class Parent(TypedDict, total=False):
    task_dir: str
    run_dir: str
    kernel_search: dict


def test_a_parent_graphs_search_node_preflights_before_writing(broken_seed, tmp_path):
    g = StateGraph(Parent)
    g.add_node("search", kernel_search_node(options={"budget": {"iterations": 1}}))
    g.add_edge(START, "search")
    g.add_edge("search", END)
    with pytest.raises(PreflightFailed, match="its seed does not pass"):
        g.compile(checkpointer=InMemorySaver()).invoke({"task_dir": str(broken_seed), "run_dir": str(tmp_path / "sub")},
                                                       {"configurable": {"thread_id": "p1"}})
    assert not (tmp_path / "sub").exists()


def _events(run_dir, kind: str) -> list[dict]:
    with closing(sqlite3.connect(run_dir / "store.sqlite")) as db:
        return [json.loads(data) for (data,) in db.execute("select data from events where kind = ?", [kind])]


@pytest.mark.slow  # two searches on CPU slots
def test_a_second_call_with_more_iterations_continues_the_finished_run(tmp_path):
    from ksearch_graph.rundir.run_dir import RunDir

    run_dir = tmp_path / "tool"
    first = optimize_kernel.invoke({"task_dir": str(SOFTMAX), "run_dir": str(run_dir), "iterations": 1})
    assert first["stop_reason"] == "iteration budget spent (1/1)"
    # Preflight measured the seed; the search took that measurement as its own.
    assert [e["evaluated"] for e in _events(run_dir, "preflight")] == ["seed"]
    again = optimize_kernel.invoke({"task_dir": str(SOFTMAX), "run_dir": str(run_dir), "iterations": 2})
    assert again["thread_id"] == first["thread_id"] and again["stop_reason"] == "iteration budget spent (2/2)"
    # The resume probed the pool alone: the seed was measured already.
    assert [e["evaluated"] for e in _events(run_dir, "preflight")] == ["seed", ""]
    same = optimize_kernel.invoke({"task_dir": str(SOFTMAX), "run_dir": str(run_dir), "iterations": 1})
    assert same["thread_id"] == first["thread_id"] and same["stop_reason"] == again["stop_reason"]
    run = RunDir.open(run_dir, writer=True)  # every call let go of the run: `ksearch resume` can take it
    try:
        assert run.config.budget.iterations == 2  # a smaller `iterations` leaves the budget
        store = run.store()
        assert store.count_attempts() == 2 and store.get_meta("status") == "finished"
        store.close()
    finally:
        run.lock.release()


def test_a_refused_resume_lets_go_of_the_run(tmp_path):
    """In a long-lived program (an agent calling the tool) a refused resume must not keep the run locked."""
    from ksearch_graph.app.launch import resume_search
    from ksearch_graph.app.runs import start
    from ksearch_graph.config import SearchConfig
    from ksearch_graph.rundir.run_dir import RunDir, RunDirError

    start(SOFTMAX, tmp_path / "run", SearchConfig())
    with pytest.raises(RunDirError, match="is not waiting for an answer"):
        resume_search(tmp_path / "run", answer="approve")
    RunDir.open(tmp_path / "run", writer=True).lock.release()  # RunLocked if the refusal had kept it
