"""The `ksearch` command end to end, as a user runs it: real subprocesses, real run directories.

Includes the crash test: a real `ksearch run` is killed with SIGKILL at random moments and resumed until
it finishes; it must end with the same number of attempts as an uninterrupted run, and no duplicates.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, SOFTMAX, FakeOpenAIServer, Reply, attempt_rows, run_cli, show_json

pytestmark = pytest.mark.slow  # every test runs the ksearch command in subprocesses

ITERATIONS = 5


def _attempt_rows(run_dir: Path) -> list[tuple]:
    return attempt_rows(run_dir, "id", "cycle_id", "iteration", "status")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("cli") / "run"
    proc = run_cli("run", str(SOFTMAX), "--run-dir", str(run_dir), "--iterations", str(ITERATIONS),
                   "--stagnation-window", "2", check=True)
    assert "OFFLINE (no LLM)" in proc.stdout and "not K-Search's intelligence" in proc.stdout
    assert f"[  {ITERATIONS}/{ITERATIONS}]" in proc.stdout  # the live view shows the budget
    return run_dir


def test_run_show_history(finished_run):
    info = show_json(finished_run)
    assert info["iterations_done"] == ITERATIONS and info["attempts"] == ITERATIONS
    assert info["status"] == "finished" and info["planner"] == "offline"
    assert info["best"]["attempt_id"] and info["best"]["score"] > 0
    assert {"total_tokens", "per_role"} <= set(info["tokens"])
    assert (finished_run / "best" / "kernel.py").is_file()
    text = run_cli("show", str(finished_run), check=True).stdout
    assert "world model" in text and "+ n" in text  # at least one closed node in the tree view
    hist = run_cli("history", str(finished_run), "--json", check=True)
    rows = json.loads(hist.stdout)
    assert rows[-1]["node"] == "finalize" and rows[-1]["iteration"] == ITERATIONS
    assert {"init_world_model", "select_plans", "action_cycle", "update_world_model"} <= {r["node"] for r in rows}


def test_resume_of_finished_run_says_so_and_can_extend(finished_run, tmp_path):
    proc = run_cli("resume", str(finished_run), check=True)
    assert "finished" in proc.stdout
    copy = tmp_path / "copied"  # a run directory is self-contained: copy it and continue elsewhere
    subprocess.run(["cp", "-r", str(finished_run), str(copy)], check=True)
    proc = run_cli("resume", str(copy), "--iterations", str(ITERATIONS + 1), check=True)
    assert "budget raised" in proc.stdout
    assert show_json(copy)["iterations_done"] == ITERATIONS + 1
    assert show_json(finished_run)["iterations_done"] == ITERATIONS


def _digest(run_dir: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(run_dir.rglob("*")):
        if p.is_file():
            h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


def test_branch_with_edited_world_model_leaves_source_untouched(finished_run, tmp_path):
    rows = json.loads(run_cli("history", str(finished_run), "--json", check=True).stdout)
    at = next(r for r in rows if r["node"] == "init_world_model")  # the whole budget is still ahead
    wm = json.loads(run_cli("show", str(finished_run), "--world-model", "--at", at["checkpoint"], check=True).stdout)
    frontier_root = [nid for nid, n in wm["nodes"].items() if n["kind"] == "open" and n["parent"] == "root"]
    wm["nodes"][frontier_root[-1]]["action"]["value"] = 1.0  # steer the branch towards another family
    edited = tmp_path / "wm.json"
    edited.write_text(json.dumps(wm))
    before = _digest(finished_run)

    into = tmp_path / "branch"
    run_cli("branch", str(finished_run), "--at", at["checkpoint"], "--world-model", str(edited),
            "--into", str(into), check=True)
    proc = run_cli("resume", str(into), check=True)
    assert f"{frontier_root[-1]}:" in proc.stdout  # the edited action was selected first

    assert _digest(finished_run) == before  # the source run and its history are untouched
    info = show_json(into)
    assert info["branched_from"]["checkpoint"] == at["checkpoint"]
    assert info["iterations_done"] == ITERATIONS
    branch_rows = _attempt_rows(into)
    kept = [r for r in _attempt_rows(finished_run) if r[2] <= at["iteration"]]
    assert branch_rows[: len(kept)] == kept  # the branch's past is the source's past up to the fork
    hist = json.loads(run_cli("history", str(into), "--json", check=True).stdout)
    assert hist[0]["iteration"] == at["iteration"]


def test_bad_inputs_give_clear_errors(tmp_path):
    bad = tmp_path / "task"
    bad.mkdir()
    (bad / "task.json").write_text('{"name": "x", "workloads": []}')
    proc = run_cli("run", str(bad), "--run-dir", str(tmp_path / "r"))
    assert proc.returncode == 2 and "entry_point" in proc.stderr and "Traceback" not in proc.stderr
    (bad / "task.json").write_text("{not json")
    proc = run_cli("run", str(bad), "--run-dir", str(tmp_path / "r"))
    assert proc.returncode == 2 and "not valid JSON" in proc.stderr
    proc = run_cli("resume", str(tmp_path / "nowhere"))
    assert proc.returncode == 2 and "not a run directory" in proc.stderr
    proc = run_cli("branch", str(tmp_path / "nowhere"), "--at", "x", "--into", str(tmp_path / "b"))
    assert proc.returncode == 2


def test_dead_endpoint_pauses_then_resume_with_server_back(tmp_path):
    # Nothing listens on this port: the run pauses with exit code 75 and a clear message.
    with FakeOpenAIServer() as probe:
        url = probe.base_url
    run_dir = tmp_path / "run"
    proc = run_cli("run", str(SOFTMAX), "--run-dir", str(run_dir), "--iterations", "1", "--model", "m",
                   "--base-url", url, "--llm-retries", "2", "--llm-backoff", "0.01")
    assert proc.returncode == 75, proc.stderr
    assert "paused" in proc.stderr and "ksearch resume" in proc.stderr and "Traceback" not in proc.stderr
    assert show_json(run_dir)["status"] == "paused"
    # The endpoint comes back elsewhere: resume points the run at it and the search finishes.
    from conftest import insert, kernel_answer, script

    from ksearch_graph.tasks.task import load_task

    replies = [Reply.json(json.loads(script([insert("root", f"idea {i}") for i in range(3)], reflect=False))),
               Reply.content(kernel_answer(load_task(SOFTMAX))),
               Reply.json(json.loads(script([insert("n1", "next")])))]
    with FakeOpenAIServer(replies) as server:
        proc = run_cli("resume", str(run_dir), "--base-url", server.base_url, check=True)
    info = show_json(run_dir)
    assert info["status"] == "finished" and info["iterations_done"] == 1


def test_kill9_at_random_moments_then_resume_matches_uninterrupted(finished_run, tmp_path):
    rng = random.Random(int(os.environ.get("KSEARCH_KILL_SEED", "7")))
    run_dir = tmp_path / "killed"
    args = ["run", str(SOFTMAX), "--run-dir", str(run_dir), "--iterations", str(ITERATIONS),
            "--stagnation-window", "2", "--quiet"]
    kills = 0
    for _round in range(12):
        proc = subprocess.Popen([sys.executable, "-m", "ksearch_graph.cli.main", *args], cwd=REPO,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            proc.wait(timeout=rng.uniform(0.5, 12.0) if kills < 4 else 600)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
        else:
            assert proc.returncode == 0, proc.stderr.read()
            break
        finally:
            proc.stderr.close()
        if (run_dir / "run.json").exists():  # killed before run.json was written: start again
            args = ["resume", str(run_dir), "--quiet"]
        time.sleep(0.2)
    assert kills >= 1
    rows = _attempt_rows(run_dir)
    assert len(rows) == ITERATIONS == len(_attempt_rows(finished_run))
    assert [r[2] for r in rows] == list(range(1, ITERATIONS + 1))  # no gap, no repeat
    assert len({r[0] for r in rows}) == ITERATIONS
    info = show_json(run_dir)
    assert info["iterations_done"] == ITERATIONS and info["status"] == "finished"


def test_llm_search_through_the_real_openai_client(tmp_path, softmax_task):
    """`ksearch run --model ... --base-url ...` end to end: real ChatOpenAI, real HTTP, scripted answers."""
    from conftest import insert, kernel_answer, script

    init = json.loads(script([insert("root", f"idea {i}", value=0.9 - 0.1 * i) for i in range(3)], reflect=False))
    update = json.loads(script([insert("n1", "continue")]))
    replies = [
        Reply.hang(0.6, then=Reply.json(init)),  # the planner thinks: its time is recorded
        Reply.error(500, "overloaded"),  # retried with backoff
        Reply.content(kernel_answer(softmax_task, VARIANT="online", BLOCK_N=256)),
        Reply.content(kernel_answer(softmax_task, VARIANT="two_pass", BLOCK_N=512)),
        Reply.json(update),
    ]
    with FakeOpenAIServer(replies) as server:
        run_dir = tmp_path / "llm"
        proc = run_cli("run", str(SOFTMAX), "--run-dir", str(run_dir), "--iterations", "2", "--stagnation-window", "2",
                       "--model", "fake-model", "--base-url", server.base_url, "--llm-backoff", "0.01", check=True)
        assert "planner: fake-model" in proc.stdout and "OFFLINE" not in proc.stdout
        assert server.remaining == 0
        assert server.requests[0]["response_format"]["type"] == "json_schema"
        assert "tools" not in server.requests[2]  # the coder asks in plain text for fenced code
    info = show_json(run_dir)
    assert info["planner"] == "llm" and info["iterations_done"] == 2 and info["passed"] == 2
    roles = info["tokens"]["per_role"]
    assert roles["planner"]["calls"] == 2 and roles["planner"]["prompt_tokens"] == 22
    assert roles["coder"]["calls"] == 2 and roles["coder"]["completion_tokens"] == 14
    with sqlite3.connect(run_dir / "store.sqlite") as db:
        planner_s = [s for (s,) in db.execute("select seconds from llm_calls where role = 'planner'")]
    assert len(planner_s) == 2 and planner_s[0] >= 0.6  # counted toward --max-wall
    run_json = json.loads((run_dir / "run.json").read_text())
    assert "api_key" not in json.dumps(run_json).replace("api_key_env", "")  # no secret is ever written


def _evaluation_children(search_pid: int) -> int:
    """Judge processes of this search (their environment names it: KSEARCH_PARENT_PID), not other tests' ones."""
    out = subprocess.run(["pgrep", "-f", "harness/judge/judge.py"], capture_output=True, text=True).stdout
    mine = 0
    for pid in out.split():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:  # ended meanwhile
            continue
        mine += f"KSEARCH_PARENT_PID={search_pid}".encode() in environ
    return mine


def test_ctrl_c_stops_at_once_and_resume_finishes(tmp_path):
    run_dir = tmp_path / "interrupted"
    proc = subprocess.Popen([sys.executable, "-m", "ksearch_graph.cli.main", "run", str(SOFTMAX), "--run-dir", str(run_dir),
                             "--iterations", "2"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    deadline = time.time() + 120
    while not (run_dir / "store.sqlite").exists() or _evaluation_children(proc.pid) == 0:  # mid-evaluation
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    started = time.time()
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130 and time.time() - started < 5, out
    assert "ksearch resume" in out
    time.sleep(0.5)
    assert _evaluation_children(proc.pid) == 0  # the evaluation child died with the search
    assert show_json(run_dir)["status"] == "interrupted"
    run_cli("resume", str(run_dir), "--quiet", check=True)
    info = show_json(run_dir)
    assert info["status"] == "finished" and info["iterations_done"] == 2


def test_approve_plans_waits_and_resume_answers(tmp_path):
    run_dir = tmp_path / "approve"
    proc = run_cli("run", str(SOFTMAX), "--run-dir", str(run_dir), "--iterations", "1", "--approve-plans")
    assert proc.returncode == 76 and "waiting for approval" in proc.stdout and "[approval] next plan: n1" in proc.stdout
    assert show_json(run_dir)["status"] == "waiting" and _attempt_rows(run_dir) == []
    proc = run_cli("resume", str(run_dir), "--answer", "maybe")
    assert proc.returncode == 2 and "unknown answer" in proc.stderr
    run_cli("resume", str(run_dir), "--answer", "pick n2", check=True)
    assert [r[0] for r in _attempt_rows(run_dir)] == ["c1.1"] and show_json(run_dir)["status"] == "finished"
    with sqlite3.connect(run_dir / "store.sqlite") as db:
        assert db.execute("select node_id from attempts where id = 'c1.1'").fetchone()[0] == "n2"
