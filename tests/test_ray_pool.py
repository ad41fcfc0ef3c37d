"""The Ray evaluation pool on a real local Ray cluster (started once for the module, about 7 s).

- a short search through the CLI evaluates every candidate on Ray workers;
- a Ray worker killed while it evaluates: the evaluation runs once more on another worker, and the search records
  every attempt once; killed twice in a row, it is an infrastructure failure, tried again by the search and charged
  to no candidate;
- a cluster whose workers lack the package, or cannot make the candidates' sandbox, is refused at preflight, with
  nothing written (its own small cluster).
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
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

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


def test_a_worker_lost_twice_is_infrastructure_tried_again_and_charged_to_no_candidate(tmp_path, ray_address):
    """Two deaths in a row of one evaluation's worker: Ray's retry is spent, the search tries it once more; the
    attempt is recorded once, as what the candidate did, and the loss is an infrastructure event."""
    run_dir = tmp_path / "run"
    killed: list[int] = []

    def kill_two_evaluations_in_a_row():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not (run_dir / "run.json").exists():  # after preflight
            time.sleep(0.05)
        while time.monotonic() < deadline and len(killed) < 2:
            for worker in _ray_workers_evaluating():
                if worker not in killed and len(killed) < 2:
                    os.kill(worker, signal.SIGKILL)
                    killed.append(worker)
            time.sleep(0.05)

    watcher = threading.Thread(target=kill_two_evaluations_in_a_row, daemon=True)
    watcher.start()
    cmd = [sys.executable, "-m", "ksearch_graph.cli", "run", str(SOFTMAX), "--offline", "--iterations", "1",
           "--ray-address", ray_address, "--run-dir", str(run_dir)]
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    watcher.join(timeout=1)
    assert proc.returncode == 0 and len(killed) == 2, proc.stdout + proc.stderr
    rows = _attempts(run_dir)
    assert sorted(r[0] for r in rows) == ["c1.1", "seed"]
    assert not any("lost" in r[2]["log_excerpt"] or r[1] == "infrastructure_error" for r in rows)
    with sqlite3.connect(str(run_dir / "store.sqlite")) as db:
        events = [json.loads(d) for (d,) in db.execute("select data from events where kind = 'infrastructure'")]
    assert [e["attempt_id"] for e in events] == ["c1.1"] and "Ray worker was lost twice" in events[0]["reason"]
    assert "[infrastructure] c1.1: the Ray worker was lost twice" in proc.stdout


def test_preflight_refuses_a_cluster_whose_workers_lack_the_package(tmp_path):
    """The cluster's Python has Ray and torch but not ksearch-graph (a venv borrowing this one's site-packages
    without its .pth files): the run stops at preflight, exit 69, with the node and what to install, nothing
    written. A cluster that cannot be joined leaves nothing behind either."""
    venv = tmp_path / "no-ksearch"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(Path(p) for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())
    (next(venv.glob("lib/python3*/site-packages")) / "borrowed.pth").write_text(f"{site}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "PYTHONPATH")}
    env["RAY_AUTH_MODE"] = "disabled"
    with _own_cluster(str(venv / "bin" / "python"), env, tmp_path) as address:
        cmd = [sys.executable, "-m", "ksearch_graph.cli", "run", str(SOFTMAX), "--offline", "--iterations", "1",
               "--ray-address", address, "--run-dir", str(tmp_path / "run")]
        # Run from outside the repository: Ray hands the driver's working directory to its workers.
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 69 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert "No module named 'ksearch_graph'" in proc.stderr and "install ksearch-graph" in proc.stderr, proc.stderr
    assert "Nothing was written and nothing spent" in proc.stderr and not (tmp_path / "run").exists()

    proc = subprocess.run([sys.executable, "-m", "ksearch_graph.cli", "run", str(SOFTMAX), "--offline",
                           "--ray-address", "ray://127.0.0.1:1", "--run-dir", str(tmp_path / "run")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "cannot join the Ray cluster" in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()


def test_preflight_refuses_a_cluster_whose_nodes_cannot_make_the_sandbox(tmp_path):
    """The cluster's workers find no bubblewrap (KSEARCH_BWRAP names none there) while this host has one: the run
    stops at preflight, exit 69, naming the node and the install hint, nothing written."""
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"} | {"RAY_AUTH_MODE": "disabled"}
    with _own_cluster(sys.executable, env | {"KSEARCH_BWRAP": "/nonexistent"}, tmp_path) as address:
        cmd = [sys.executable, "-m", "ksearch_graph.cli", "run", str(SOFTMAX), "--offline", "--iterations", "1",
               "--ray-address", address, "--run-dir", str(tmp_path / "run")]
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 69 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert "Ray node" in proc.stderr and "the candidates' sandbox cannot be made there" in proc.stderr, proc.stderr
    assert "install bubblewrap" in proc.stderr and not (tmp_path / "run").exists()


@contextmanager
def _own_cluster(python: str, env: dict[str, str], cwd: Path) -> Iterator[str]:
    """A one-CPU Ray cluster started by ``python`` with ``env`` (its workers' Python and environment); its address."""
    starter = ("import ray, sys; ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False); "
               "print(ray.get_runtime_context().gcs_address, flush=True); sys.stdin.read()")
    cluster = subprocess.Popen([python, "-c", starter], env=env, cwd=cwd, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        address = cluster.stdout.readline().strip()
        assert address, "the cluster did not start"
        yield address
    finally:
        cluster.stdin.close()
        cluster.wait(timeout=60)
