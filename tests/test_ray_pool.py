"""The Ray evaluation pool on a real local Ray cluster (started once for the module, about 7 s).

- a short search through the CLI evaluates every candidate on Ray workers;
- a Ray worker killed while it evaluates: the evaluation runs once more on another worker, and the search records
  every attempt once; killed twice in a row, it is an infrastructure failure, tried again by the search and charged
  to no candidate;
- two nodes, the second started from a virtual environment with only Ray, torch and Triton: the search ships the
  package, runs evaluations on both and removes its task copies;
- a cluster whose workers cannot make the candidates' sandbox is refused at preflight, with nothing written (its own
  small cluster).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import REPO, SOFTMAX, run_cli

pytestmark = pytest.mark.slow  # starts a local Ray and runs searches on it

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def ray_address():
    """A local Ray 'cluster' of two CPUs, which the CLI's searches join by its address."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)  # the searches ship the package to it
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


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
                if b"harness/judge/judge.py" not in f.read():
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
    cmd = [sys.executable, "-m", "ksearch_graph.cli.main", "run", str(SOFTMAX), "--offline", "--iterations", "2",
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
    retried = [r for r in rows if r[2]["environment"].get("ray_retries")]
    assert len(retried) == 1 and "WorkerCrashedError" in retried[0][2]["environment"]["ray_retries"][0], rows


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
    cmd = [sys.executable, "-m", "ksearch_graph.cli.main", "run", str(SOFTMAX), "--offline", "--iterations", "1",
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


def test_a_search_runs_on_two_nodes_and_the_second_has_nothing_of_ours(tmp_path):
    """A head node started from this environment, and a second node (``ray start --address``) from a virtual
    environment that has only Ray, torch and Triton, pip-installed: no ksearch_graph and no pydantic. A search joined
    through Ray Client (ray://) ships the package with its evaluations, which run on both nodes; its task copies are
    gone when it ends. A cluster that cannot be joined leaves nothing behind."""
    venv = _worker_venv(tmp_path / "worker-venv")
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "PYTHONPATH")}
    env["RAY_AUTH_MODE"] = "disabled"
    for module in ("ksearch_graph", "pydantic"):
        lacking = subprocess.run([str(venv / "bin" / "python"), "-c", f"import {module}"], capture_output=True,
                                 text=True, cwd=tmp_path, env=env)
        assert f"No module named '{module}'" in lacking.stderr
    copies = Path(tempfile.gettempdir()) / "ksearch-ray-tasks"
    before = set(os.listdir(copies)) if copies.is_dir() else set()
    gcs, client = _free_port(), _free_port()
    ray_cli = str(Path(sys.executable).with_name("ray"))
    with _node([ray_cli, "start", "--head", "--block", f"--port={gcs}", f"--ray-client-server-port={client}",
                "--num-cpus=1", "--include-dashboard=false", "--disable-usage-stats"],
               env | {"GRPC_ENABLE_FORK_SUPPORT": "false"}, tmp_path), \
            _node([str(venv / "bin" / "ray"), "start", f"--address=127.0.0.1:{gcs}", "--block", "--num-cpus=1",
                   "--disable-usage-stats"], env | {"PATH": f"{venv / 'bin'}{os.pathsep}{env['PATH']}"}, tmp_path):
        _wait_for_nodes(f"127.0.0.1:{gcs}", 2, env)
        run_dir = tmp_path / "run"
        cmd = [sys.executable, "-m", "ksearch_graph.cli.main", "run", str(SOFTMAX), "--offline", "--iterations", "4",
               "-k", "2", "--ray-address", f"ray://127.0.0.1:{client}", "--run-dir", str(run_dir)]
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    _forget_cluster(gcs)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("preflight: Ray node") == 1 and proc.stdout.count("; Ray node") == 1, proc.stdout
    rows = _attempts(run_dir)
    assert len(rows) == 5 and all(r[1] != "infrastructure_error" for r in rows), rows
    nodes = {r[2]["environment"].get("ray_node") for r in rows}
    assert len(nodes) == 2 and None not in nodes, nodes  # evaluations ran on both nodes
    after = set(os.listdir(copies)) if copies.is_dir() else set()
    assert after <= before, f"task copies left behind: {sorted(after - before)}"

    proc = subprocess.run([sys.executable, "-m", "ksearch_graph.cli.main", "run", str(SOFTMAX), "--offline",
                           "--ray-address", "ray://127.0.0.1:1", "--run-dir", str(tmp_path / "run2")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "cannot join the Ray cluster" in proc.stderr, proc.stderr
    assert not (tmp_path / "run2").exists()


def _worker_venv(path: Path) -> Path:
    """A virtual environment of this Python with Ray, torch and Triton and what they require, and nothing else of
    ours. Their installed files are hard-linked from this environment (copied across file systems): the same files
    pip would unpack from the same wheels, in seconds instead of the minute pip takes for the 2 GB. Hard links, not
    symbolic ones: the candidates' sandbox binds the worker's site-packages and no folder a link would point into."""
    from importlib import metadata

    from packaging.requirements import Requirement

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    site = Path(subprocess.run([str(path / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path("
                                "'purelib'))"], check=True, capture_output=True, text=True).stdout.strip())
    wanted, found = ["ray", "torch", "triton"], {}
    while wanted:
        dist = metadata.distribution(wanted.pop())
        if dist.name.lower() in found:
            continue
        found[dist.name.lower()] = dist
        requires = [Requirement(r) for r in dist.requires or []]
        wanted += [r.name for r in requires if not r.marker or r.marker.evaluate({"extra": ""})]
    tops = {Path(dist.locate_file(f.parts[0])) for dist in found.values() for f in dist.files or []
            if f.parts[0] not in ("..", "__pycache__") and not f.parts[0].endswith(".pth")}
    for top in tops:
        if top.is_dir():
            shutil.copytree(top, site / top.name, copy_function=_link_or_copy)
        else:
            _link_or_copy(top, site / top.name)
    for entry in found["ray"].entry_points.select(group="console_scripts", name="ray"):
        module, function = entry.value.split(":")
        script = path / "bin" / "ray"
        script.write_text(f"#!{path / 'bin' / 'python'}\nimport sys\nfrom {module} import {function}\n"
                          f"sys.exit({function}())\n")
        script.chmod(0o755)
    return path


def _link_or_copy(source: str | Path, target: str | Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _forget_cluster(port: int) -> None:
    """``ray start`` noted its head as this machine's current cluster, where a later ray.init() without an address
    would join it; ``ray stop`` forgets it, a stopped ``--block`` does not."""
    note = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
    try:
        if note.read_text().strip().endswith(f":{port}"):
            note.unlink()
    except OSError:
        pass


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def _node(cmd: list[str], env: dict[str, str], cwd: Path) -> Iterator[None]:
    """A Ray node kept by ``ray start --block``; stopped (with everything it started) on leaving."""
    node = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        yield
    finally:
        node.send_signal(signal.SIGTERM)
        try:
            node.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(node.pid, signal.SIGKILL)
            node.wait()


def _wait_for_nodes(address: str, count: int, env: dict[str, str]) -> None:
    probe = ("import ray, sys, time\n"
             "for _ in range(120):\n"
             "    try:\n"
             "        ray.init(address=sys.argv[1], log_to_driver=False)\n"
             "        break\n"
             "    except Exception:\n"
             "        time.sleep(1)\n"
             "for _ in range(120):\n"
             "    if sum(n['Alive'] for n in ray.nodes()) >= int(sys.argv[2]):\n"
             "        sys.exit(0)\n"
             "    time.sleep(1)\n"
             "sys.exit(1)\n")
    done = subprocess.run([sys.executable, "-c", probe, address, str(count)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"the cluster did not reach {count} nodes: {done.stderr[-2000:]}"


def test_preflight_refuses_a_cluster_whose_nodes_cannot_make_the_sandbox(tmp_path):
    """The cluster's workers find no bubblewrap (KSEARCH_BWRAP names none there) while this host has one: the run
    stops at preflight, exit 69, naming the node and the install hint, nothing written."""
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"} | {"RAY_AUTH_MODE": "disabled"}
    with _own_cluster(sys.executable, env | {"KSEARCH_BWRAP": "/nonexistent"}, tmp_path) as address:
        cmd = [sys.executable, "-m", "ksearch_graph.cli.main", "run", str(SOFTMAX), "--offline", "--iterations", "1",
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
