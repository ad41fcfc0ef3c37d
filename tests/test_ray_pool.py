"""The Ray evaluation pool on a real local Ray cluster (started once for the module, about 7 s).

- a short search through the CLI evaluates every candidate on Ray workers;
- a Ray worker killed while it evaluates: the evaluation runs once more on another worker, and the search records
  every attempt once.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import pytest
from conftest import REPO, SOFTMAX, run_cli

pytestmark = pytest.mark.slow  # starts a local Ray and runs searches on it

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def ray_address():
    """A local Ray 'cluster' of two CPUs, which the CLI's searches join by its address."""
    env_path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = f"{REPO}{os.pathsep}{env_path}" if env_path else str(REPO)  # workers import us
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
        os.environ["PYTHONPATH"] = env_path


def _attempts(run_dir):
    with sqlite3.connect(str(run_dir / "store.sqlite")) as db:
        return [(r[0], r[1], json.loads(r[2])) for r in db.execute("select id, status, result from attempts")]


def test_a_short_search_evaluates_on_ray(tmp_path, ray_address):
    run_cli("run", str(SOFTMAX), "--offline", "--iterations", "2", "-k", "2", "--ray-address", ray_address,
            "--run-dir", str(tmp_path / "run"), check=True)
    rows = _attempts(tmp_path / "run")
    assert len(rows) == 3  # the seed and two iterations
    assert all(r[2]["environment"].get("ray_node") and r[2]["environment"]["gpu_model"] == "cpu" for r in rows)


def _ray_workers_evaluating() -> list[int]:
    """Ray worker processes whose child is an evaluation judge right now."""
    workers = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if b"harness/judge.py" not in f.read():
                    continue
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{ppid}/cmdline", "rb") as f:
                if f.read().startswith(b"ray::"):
                    workers.append(ppid)
        except (OSError, IndexError, ValueError):
            continue
    return workers


def test_a_killed_worker_is_retried_and_nothing_is_lost_or_repeated(tmp_path, ray_address):
    killed: list[int] = []

    def kill_one_worker_mid_evaluation():
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not killed:
            workers = _ray_workers_evaluating()
            if workers:
                os.kill(workers[0], signal.SIGKILL)
                killed.append(workers[0])
            time.sleep(0.05)

    watcher = threading.Thread(target=kill_one_worker_mid_evaluation, daemon=True)
    watcher.start()
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "ksearch_graph.cli", "run", str(SOFTMAX), "--offline", "--iterations", "2",
           "--ray-address", ray_address, "--run-dir", str(run_dir)]
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    watcher.join(timeout=1)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert killed, "no worker was caught evaluating"
    rows = _attempts(run_dir)
    ids = [r[0] for r in rows]
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 3
    # The killed worker's evaluation ran again elsewhere: no attempt carries the "lost" result.
    assert not any("lost on the Ray cluster" in r[2]["log_excerpt"] for r in rows)
    assert all(r[2]["environment"].get("ray_node") for r in rows)
