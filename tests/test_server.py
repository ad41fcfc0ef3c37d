"""The graph served by `langgraph dev` on loopback, driven over HTTP with the official langgraph-sdk client."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import REPO, SOFTMAX

pytestmark = pytest.mark.slow  # starts langgraph dev

sdk = pytest.importorskip("langgraph_sdk", reason="the dev extra installs langgraph-sdk")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = _free_port()
    langgraph = Path(sys.executable).parent / "langgraph"
    proc = subprocess.Popen([str(langgraph), "dev", "--host", "127.0.0.1", "--port", str(port), "--no-browser",
                             "--no-reload"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while True:
        try:
            urllib.request.urlopen(url + "/ok", timeout=2)
            break
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                raise AssertionError("langgraph dev did not start:\n" + proc.stdout.read()[-3000:]) from None
            time.sleep(0.5)
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_run_stream_history_and_fork_over_http(server, tmp_path):
    client = sdk.get_sync_client(url=server)
    thread = client.threads.create()["thread_id"]
    context = {"task": str(SOFTMAX), "run_dir": str(tmp_path / "run"),
               "options": {"budget": {"iterations": 2}, "stagnation_window": 2}}
    events = [part.data for part in client.runs.stream(thread, "ksearch", input={}, context=context,
                                                        stream_mode="custom", stream_subgraphs=True)
              if part.event.startswith("custom")]
    kinds = [e["event"] for e in events]
    assert "world_model" in kinds and kinds.count("attempt") == 3 and kinds[-1] == "finished"  # seed + 2
    from dataclasses import fields

    from ksearch_graph.search.events import AttemptEvent

    for e in (e for e in events if e["event"] == "attempt"):
        assert {f.name for f in fields(AttemptEvent)} | {"event"} == set(e)  # the typed fields clients rely on
        assert AttemptEvent(**{k: v for k, v in e.items() if k != "event"}).as_message() == e

    state = client.threads.get_state(thread)
    assert state["values"]["iterations_done"] == 2 and state["next"] == []
    history = client.threads.get_history(thread, limit=50)
    nodes = [h["values"].get("last_node") for h in history]
    assert nodes[0] == "finalize" and "init_world_model" in nodes

    # Fork: from the checkpoint after initialisation, with an edited world model (the last action first).
    after_init = next(h for h in history if h["values"].get("last_node") == "init_world_model")
    wm = after_init["values"]["world_model"]
    last = sorted(n for n, node in wm["nodes"].items() if node["kind"] == "open")[-1]
    wm["nodes"][last]["action"]["value"] = 1.0
    fork = client.threads.update_state(thread, {"world_model": wm}, as_node="init_world_model",
                                       checkpoint_id=after_init["checkpoint"]["checkpoint_id"])
    # Budgets are the run's (its store's), whatever path spent them: the fork gets 2 more iterations than were used.
    more = {**context, "options": {**context["options"], "budget": {"iterations": 4}}}
    forked = [part.data for part in client.runs.stream(thread, "ksearch", input=None, context=more,
                                                        checkpoint_id=fork["checkpoint"]["checkpoint_id"],
                                                        stream_mode="custom", stream_subgraphs=True)
              if part.event.startswith("custom")]
    started = [e for e in forked if e.get("event") == "cycle_started"]
    assert started and started[0]["node_id"] == last, forked
    assert started[0]["cycle_id"] == "c1b"  # the first history's c1 keeps its attempts in the shared store
    assert client.threads.get_state(thread)["values"]["iterations_done"] == 2


def test_plan_approval_interrupt_and_resume_over_http(server, tmp_path):
    client = sdk.get_sync_client(url=server)
    thread = client.threads.create()["thread_id"]
    context = {"task": str(SOFTMAX), "run_dir": str(tmp_path / "approve"),
               "options": {"budget": {"iterations": 1}, "approve_plans": True}}
    client.runs.wait(thread, "ksearch", input={}, context=context)
    state = client.threads.get_state(thread)
    interrupts = [i for task in state["tasks"] for i in task.get("interrupts", [])]
    assert interrupts and interrupts[0]["value"]["question"] == "approve_plan"
    assert state["next"] == ["select_plans"]
    client.runs.wait(thread, "ksearch", command={"resume": {"decision": "pick", "node_id": "n2"}}, context=context)
    state = client.threads.get_state(thread)
    assert state["next"] == [] and state["values"]["iterations_done"] == 1
    assert state["values"]["world_model"]["nodes"]["n2"]["visits"] == 1


def _docs_example() -> str:
    """The SDK example of docs/server.md, as a user copies it."""
    text = (REPO / "docs" / "server.md").read_text()
    return text.split("with the official SDK:\n\n```python\n", 1)[1].split("```", 1)[0]


def test_docs_server_example_runs_without_a_reload(tmp_path):
    """docs/server.md's example, word for word (only the port differs), against `langgraph dev` as the docs start
    it: with reloading on. Its run directory is outside the watched folder, so the server never restarts."""
    port = _free_port()
    langgraph = Path(sys.executable).parent / "langgraph"
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([str(langgraph), "dev", "--host", "127.0.0.1", "--port", str(port), "--no-browser"],
                                cwd=REPO, stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/ok", timeout=2)
                break
            except OSError:
                assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
                time.sleep(0.5)
        example = _docs_example().replace("http://127.0.0.1:2024", f"http://127.0.0.1:{port}")
        done = subprocess.run([sys.executable, "-c", example], cwd=REPO, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "HOME": str(tmp_path)})
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.count("'event': 'attempt'") == 3 and "'attempt_id'" in done.stdout.splitlines()[-1]
        run_dir = tmp_path / "ksearch-runs" / "server-1"
        # The server is the run directory's writer while it serves it; the CLI is refused, readers are not.
        refused = subprocess.run([sys.executable, "-m", "ksearch_graph.cli.main", "resume", str(run_dir)], cwd=REPO,
                                 capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2 and "another process" in refused.stderr, refused.stderr
        text = log.read_text()
        assert "WatchFiles detected changes" not in text and "Reloading" not in text, text[-3000:]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
