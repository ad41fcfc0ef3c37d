"""Budgets are hard limits, at the CLI: a run stopped mid-cycle (kill -9, Ctrl-C, a full disk) and resumed with a new
budget, or a branch at an attempt resumed with --more, runs exactly the budget set, whatever allowance the cycle in
progress was launched with (here 12 iterations, the whole first budget)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest
from conftest import REPO, SOFTMAX, run_cli, show_json

pytestmark = pytest.mark.slow  # real searches through the CLI, stopped and resumed


def _done(run: Path) -> int:
    try:
        with closing(sqlite3.connect(f"file:{run / 'store.sqlite'}?immutable=1", uri=True)) as db:
            return db.execute("select count(*) from attempts where prompt_kind != 'seed'").fetchone()[0]
    except sqlite3.Error:
        return 0


def _stopped_mid_cycle(run: Path, sig: int) -> subprocess.CompletedProcess:
    """A search with one long cycle (allowance 12, no stagnation stop) stopped by ``sig`` after its first attempt."""
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    proc = subprocess.Popen([sys.executable, "-m", "ksearch_graph.cli.main", "run", str(SOFTMAX), "--run-dir", str(run),
                             "--iterations", "12", "--stagnation-window", "12", "--quiet"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    while _done(run) < 1 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert 1 <= _done(run) < 12, (out, err)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _budget_and_done(run: Path) -> tuple[int, int]:
    info = show_json(run)
    return info["iteration_budget"], info["iterations_done"]


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("budgets") / "killed"
    assert _stopped_mid_cycle(run, signal.SIGKILL).returncode == -signal.SIGKILL
    return run


def test_resume_after_kill9_and_a_branch_at_an_attempt_obey_their_new_budget(killed, tmp_path):
    run = tmp_path / "more"
    shutil.copytree(killed, run)
    done = _done(run)
    run_cli("resume", str(run), "--more", "1", "--quiet", check=True)
    assert _budget_and_done(run) == (done + 1, done + 1)

    run = tmp_path / "total"
    shutil.copytree(killed, run)
    run_cli("resume", str(run), "--iterations", str(done + 2), "--quiet", check=True)
    assert _budget_and_done(run) == (done + 2, done + 2)
    assert show_json(run)["stop_reason"] == f"iteration budget spent ({done + 2}/{done + 2})"

    branch = tmp_path / "branch"  # the branch's cycle was launched with the source's allowance (12)
    run_cli("branch", str(run), "--at-attempt", "c1.1", "--into", str(branch), check=True)
    run_cli("resume", str(branch), "--more", "2", "--quiet", check=True)
    assert _budget_and_done(branch) == (3, 3)


def test_resume_after_ctrl_c_and_after_a_full_disk_obey_their_new_budget(killed, tmp_path):
    run = tmp_path / "interrupted"
    stop = _stopped_mid_cycle(run, signal.SIGINT)
    assert stop.returncode == 130 and "interrupted" in stop.stderr, stop.stderr
    done = _done(run)
    run_cli("resume", str(run), "--more", "1", "--quiet", check=True)
    assert _budget_and_done(run) == (done + 1, done + 1)

    run = tmp_path / "full"
    shutil.copytree(killed, run)
    limit = max(p.stat().st_size for p in run.rglob("*") if p.is_file()) + 8192

    def small_disk():  # a file-size limit stands in for a disk that fills up mid-run
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    full = subprocess.run([sys.executable, "-m", "ksearch_graph.cli.main", "resume", str(run), "--quiet"], cwd=REPO,
                          capture_output=True, text=True, timeout=900, preexec_fn=small_disk)
    assert full.returncode == 74 and "disk is full" in full.stderr, full.stderr
    done = _done(run)
    run_cli("resume", str(run), "--iterations", str(done + 1), "--quiet", check=True)
    assert _budget_and_done(run) == (done + 1, done + 1)
    assert json.loads((run / "run.json").read_text())["config"]["budget"]["iterations"] == done + 1
