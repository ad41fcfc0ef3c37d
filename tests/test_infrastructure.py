"""Failures the candidate did not cause, at the CLI: preflight refuses a broken task before anything is spent, and a
judge killed mid-run is tried again, never recorded as the candidate's attempt nor shown to the LLM; when the
infrastructure stays down the run stops (exit 69) with nothing charged, and resume goes on without a new LLM call.
(Ray: tests/test_ray_pool.py.)"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import closing
from pathlib import Path

import pytest
from conftest import REPO, SOFTMAX, FakeOpenAIServer, Reply, insert, kernel_answer, run_cli, script


def test_the_failure_markers_are_what_the_harness_writes():
    """failures.classify recognises the judge's and the client's own words: each is defined once (harness/job.py,
    parent/failures.py) and the modules that write it use that name."""
    harness = REPO / "ksearch_graph" / "harness"
    judge, client, runner, runner_process = ((harness / name).read_text() for name in
                                             ("judge/judge.py", "parent/client.py", "candidate/runner.py",
                                              "judge/runner_process.py"))
    judge += (harness / "judge" / "session.py").read_text() + (harness / "judge" / "evaluate.py").read_text()
    assert "{TASK_REFERENCE}" in judge and "clip(JUDGE_CRASH +" in judge
    for marker in ("{JUDGE_LOST}", "{CANNOT_START}", "{UNREADABLE}"):
        assert marker in client, marker
    assert "{REFERENCE_IN_RUNNER}" in runner and "{RUNNER_DIED}{how} during {self.phase}" in runner_process
    # the judge's requests before the candidate's code is imported
    assert judge.index("timeout_s, STARTING_RUNNER") < judge.index("timeout_s, LOADING_TASK") < judge.index(
        '"compiling (importing) the candidate"')


def test_the_judge_options_and_job_travel_intact():
    from ksearch_graph.harness.job import Job, JudgeOptions

    options = JudgeOptions(candidate="/c", out="/o.json", job_from_stdin=True, time_budget_s=0.25,
                           memory_limit_gb=8.0, no_network_isolation=True, sandbox="none", eval_cache="/e")
    assert JudgeOptions.parse(options.command_line(), "judge") == options
    job = Job("/task", "a,b", {"key": "k", "workloads": {}})
    assert Job.from_json(job.to_json().decode()) == job
    assert JudgeOptions.parse(["--job-from-stdin", "--candidate", "c", "--out", "o"], "j").with_job(job).task == "/task"
    for bad, words in (("[]", "JSON object"), ("{", "not valid JSON"), ('{"task": 3}', "task folder"),
                       ('{"task": "t", "timings": [1]}', "'timings'"), ('{"task": "t", "extra": 1}', "unknown")):
        with pytest.raises(ValueError, match=words):
            Job.from_json(bad)
    with pytest.raises(SystemExit):  # neither a task nor a job to wait for
        JudgeOptions.parse(["--candidate", "c", "--out", "o"], "judge")


def test_classify_tells_the_tasks_and_the_harness_failures_from_the_candidates():
    from ksearch_graph.harness.parent.failures import classify
    from ksearch_graph.tasks.evaluation import EvalResult, Status

    def kind(status, log, reference=None):
        result = classify(EvalResult(status=status, log_excerpt=log), reference=reference)
        return result.status.value, result.infrastructure

    crash = 'evaluation failed: Traceback\n  File "/t/task/reference.py", line 33\nSyntaxError: invalid syntax'
    assert kind(Status.runtime_error, crash, "reference.py") == ("infrastructure_error",
                                                                  "the task's reference failed (a task bug)")
    assert kind(Status.runtime_error, crash)[1] == "the evaluation's judge process crashed"
    assert kind(Status.runtime_error, "the evaluation process was killed by SIGKILL (Killed); it was at: x")[1] \
        == "the evaluation's judge process was killed by SIGKILL (Killed)"
    assert kind(Status.unavailable, "cannot start /usr/bin/python: [Errno 28] No space left")[0] == \
        "infrastructure_error"
    assert kind(Status.runtime_error, "the task's reference failed to load in the candidate's process (a task "
                "bug, not the candidate's):\nModuleNotFoundError: No module named 'x'")[1] == \
        "the task's reference failed (a task bug)"
    assert kind(Status.runtime_error, "the candidate's process exited with code 1 during starting the candidate's "
                "process\nbwrap: setting up uid map: Permission denied")[0] == "infrastructure_error"
    assert kind(Status.runtime_error, "the candidate's process was killed by SIGSEGV (Segmentation fault) during "
                "compiling (importing) the candidate\n") == ("runtime_error", "")
    assert kind(Status.runtime_error, "Traceback ...\nZeroDivisionError: division by zero") == ("runtime_error", "")
    assert kind(Status.unavailable, "this task's candidates are cuda code and this machine has no CUDA GPU") == \
        ("unavailable", "")


def _replies(n_updates: int = 2) -> list[Reply]:
    from ksearch_graph.tasks.task import load_task

    init = json.loads(script([insert("root", f"idea {i}", value=0.9 - 0.1 * i) for i in range(3)], reflect=False))
    update = json.loads(script([insert("n1", "continue")]))
    return [Reply.json(init), Reply.content(kernel_answer(load_task(SOFTMAX)))] + [Reply.json(update)] * n_updates


@pytest.mark.slow
def test_a_broken_reference_is_refused_before_anything_is_spent(tmp_path):
    task = tmp_path / "broken"
    shutil.copytree(SOFTMAX, task)
    lines = (task / "reference.py").read_text().splitlines()
    lines[-1] += " )("  # a syntax error on the reference's last line
    (task / "reference.py").write_text("\n".join(lines) + "\n")
    with FakeOpenAIServer(_replies()) as server:
        proc = run_cli("run", str(task), "--run-dir", str(tmp_path / "run"), "--iterations", "2", "--model",
                       "fake-model", "--base-url", server.base_url)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert "preflight: task softmax: its reference fails in the harness" in proc.stderr, proc.stderr
    assert f"reference.py, line {len(lines)}" in proc.stderr and "Nothing was written" in proc.stderr, proc.stderr
    assert server.requests == [] and not (tmp_path / "run").exists()
    assert not list(tmp_path.glob(".run.new-*"))


def _judges_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and b"harness/judge/judge.py" in cmd:
            found.append(int(entry))
    return found


class JudgeKiller(threading.Thread):
    """Kills (SIGKILL) up to ``count`` evaluation judges of process ``pid`` once ``armed()`` is true."""

    def __init__(self, pid: int, count: int, armed):
        super().__init__(daemon=True)
        self.pid, self.count, self.armed, self.killed, self.done = pid, count, armed, [], threading.Event()

    def run(self):
        while not self.done.is_set() and len(self.killed) < self.count:
            if self.armed():
                for judge in _judges_of(self.pid):
                    if judge not in self.killed and len(self.killed) < self.count:
                        try:
                            os.kill(judge, signal.SIGKILL)
                            self.killed.append(judge)
                        except ProcessLookupError:
                            pass
            time.sleep(0.05)


def _ksearch(*args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"} | {"PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "ksearch_graph.cli.main", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _rows(run: Path, sql: str) -> list[tuple]:
    with closing(sqlite3.connect(f"file:{run / 'store.sqlite'}?immutable=1", uri=True)) as db:
        return db.execute(sql).fetchall()


@pytest.mark.slow
def test_killed_judges_are_tried_again_then_stop_the_run_and_resume_spends_nothing_twice(tmp_path):
    run = tmp_path / "run"
    with FakeOpenAIServer(_replies()) as server:
        # 1. Every judge killed once the planner has answered: the candidate's evaluation fails outside its code 3
        # times, and so does the seed's (the control): the infrastructure is down, the run stops, nothing charged.
        proc = _ksearch("run", str(SOFTMAX), "--run-dir", str(run), "--iterations", "1", "--model", "fake-model",
                        "--base-url", server.base_url)
        killer = JudgeKiller(proc.pid, 99, lambda: len(server.requests) >= 2)
        killer.start()
        out, err = proc.communicate(timeout=900)
        killer.done.set()
        assert proc.returncode == 69, out + err
        assert "failed 3 times in a row outside the candidate's code" in err and "code known to pass fails there" \
            in err and f"ksearch resume {run}" in err and "Traceback" not in err, err
        assert out.count("[infrastructure] c1.1:") == 3 and "not the candidate's failure" in out, out
        assert _rows(run, "select id from attempts where prompt_kind != 'seed'") == []
        assert len(server.requests) == 2  # the planner's first answer and one code generation

        # 2. Resumed while two more judges die: the candidate is evaluated again (its code reused, the coder not
        # asked again) and passes; the kills are infrastructure events, never its attempt or its feedback.
        proc = _ksearch("resume", str(run))
        killer = JudgeKiller(proc.pid, 2, lambda: True)
        killer.start()
        out, err = proc.communicate(timeout=900)
        killer.done.set()
        assert proc.returncode == 0 and len(killer.killed) == 2, out + err
    assert _rows(run, "select id, status from attempts where prompt_kind != 'seed'") == [("c1.1", "passed")]
    events = [json.loads(d) for (d,) in _rows(run, "select data from events where kind = 'infrastructure'")]
    assert [e["attempt_id"] for e in events] == ["c1.1"] * 5 and all("killed by SIGKILL" in e["reason"]
                                                                      for e in events)
    assert len(server.requests) == 3  # + the update after the cycle: no code generation paid twice
    prompts = json.dumps(server.requests)
    assert "SIGKILL" not in prompts and "killed" not in prompts.lower()
    info = json.loads(run_cli("show", str(run), "--json", check=True).stdout)
    assert info["status"] == "finished" and info["iterations_done"] == 1
