"""The candidate's process in its OS sandbox (harness/judge/sandbox.py, cgroup.py): what it is allowed, and, against a
candidate written to do harm, that it plants nothing, reads no secret, kills no neighbour and makes the judge open no
connection (tests/cheats/plant_files.py, read_secrets.py, kill_neighbours.py, address_message.py).

The sandbox needs bubblewrap: these tests skip where it cannot be made, unless KSEARCH_REQUIRE_SANDBOX=1 (CI sets it:
there a missing sandbox is a failure)."""

from __future__ import annotations

import hashlib
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ksearch_graph.harness.judge import sandbox
from ksearch_graph.harness.judge.cgroup import CpuAccount, CpuGroup, ProcessTree
from ksearch_graph.harness.parent.client import SandboxUnavailable, SubprocessEvaluator
from ksearch_graph.tasks.evaluation import Status
from ksearch_graph.tasks.task import load_task

CHEATS = Path(__file__).resolve().parent / "cheats"
HARNESS = Path(sandbox.__file__).resolve().parent
REASON = sandbox.unavailable_reason()
needs_sandbox = pytest.mark.skipif(REASON is not None and os.environ.get("KSEARCH_REQUIRE_SANDBOX") != "1",
                                   reason=f"no sandbox on this host: {REASON}")


def cheat(name: str, **replace: str) -> dict[str, str]:
    text = (CHEATS / f"{name}.py").read_text()
    for old, new in replace.items():
        text, count = re.subn(old, new, text)
        assert count, f"{name}.py has no {old!r}"
    return {"kernel.py": text}


def explain(r) -> str:
    return f"status={r.status.value}\n{r.log_excerpt}"


# --- what the sandbox is made of (fast) -------------------------------------------------------------------------------


def test_the_environment_is_an_allow_list():
    env = {"PATH": "/usr/bin", "LANG": "C.UTF-8", "LC_ALL": "C", "CUDA_VISIBLE_DEVICES": "3", "HOME": "/root",
           "DATABASE_URL": "postgres://u:pw@h/db", "HF_AUTH": "x", "OPENAI_API_KEY": "sk-1", "MY_THING": "y",
           "TORCH_CUDA_ARCH_LIST": "9.0", "NCCL_NVLS_ENABLE": "0", "PYTHONPATH": "/home/u/secret-src"}
    assert sandbox.allowed_env(env) == {"LANG": "C.UTF-8", "LC_ALL": "C", "CUDA_VISIBLE_DEVICES": "3",
                                        "TORCH_CUDA_ARCH_LIST": "9.0", "NCCL_NVLS_ENABLE": "0"}


def test_the_command_isolates_everything_and_binds_only_what_the_candidate_needs(tmp_path):
    box = sandbox.Sandbox("bwrap")
    box.bwrap = "/usr/bin/bwrap"
    cmd, popen_env = box.command(["python", "runner.py"], candidate=str(tmp_path / "c"), cache=str(tmp_path / "k"),
                                 env={"PATH": "/usr/bin", "HOME": "/root", "SECRET_TOKEN": "x"}, extra_env={"A": "1"})
    assert popen_env == {}
    for flag in ("--unshare-all", "--die-with-parent", "--new-session", "--clearenv"):
        assert flag in cmd
    assert cmd[cmd.index("--cap-drop") + 1] == "ALL"
    binds = {(cmd[i], cmd[i + 1], cmd[i + 2]) for i in range(len(cmd) - 2) if cmd[i].startswith("--")}
    writable = {src for kind, src, _ in binds if kind == "--bind"}
    assert writable == {str(tmp_path / "c"), str(tmp_path / "k")}
    readable = {src for kind, src, _ in binds if kind == "--ro-bind"}
    root = str(Path(sandbox.HARNESS_ROOT).resolve())
    assert root not in readable and os.path.join(root, "ksearch_graph") in readable  # the package, not the checkout
    assert not any(p in ("/", "/root", "/home", "/tmp", "/etc") for p in readable)
    assert "SECRET_TOKEN" not in cmd and ("--setenv", "HOME", sandbox.HOME) in {
        (cmd[i], cmd[i + 1], cmd[i + 2]) for i in range(len(cmd) - 2)}
    assert cmd[-2:] == ["python", "runner.py"]


def test_a_compiler_outside_usr_and_an_environment_under_tmp_stay_visible(tmp_path):
    """CC naming a compiler in its own installation (a GPU host's /opt/gcc/bin/gcc: Triton builds its launchers with
    it) is bound read-only, the installation above bin/; binds under /tmp come after the private /tmp, which would
    hide them."""
    gcc = tmp_path / "opt-gcc" / "bin" / "gcc"
    gcc.parent.mkdir(parents=True)
    gcc.write_text("")
    box = sandbox.Sandbox("bwrap")
    box.bwrap = "/usr/bin/bwrap"
    cmd, _ = box.command(["python"], candidate=str(tmp_path / "c"), cache=str(tmp_path / "k"),
                         env={"PATH": "/usr/bin", "CC": str(gcc)}, extra_env={})
    binds = [(cmd[i], cmd[i + 1]) for i in range(len(cmd) - 1) if cmd[i] in ("--ro-bind", "--bind", "--tmpfs")]
    assert ("--ro-bind", str(tmp_path / "opt-gcc")) in binds
    tmpfs = binds.index(("--tmpfs", "/tmp"))
    assert all(i > tmpfs for i, (_, src) in enumerate(binds) if src.startswith("/tmp/"))


def _linked_environment(tmp_path: Path) -> tuple[Path, Path]:
    """An import-path folder whose package is a link to a folder elsewhere, as uv's --link-mode=symlink or a Nix
    profile makes them, and one link to a folder that holds the home."""
    store = tmp_path / "store" / "linkedpkg"
    store.mkdir(parents=True)
    (store / "__init__.py").write_text("VALUE = 42\n")
    site = tmp_path / "site-packages"
    site.mkdir()
    (site / "linkedpkg").symlink_to(store)
    (site / "everything").symlink_to("/")
    return site, store


def test_packages_linked_into_the_environment_are_bound_where_the_links_point(tmp_path, monkeypatch):
    site, store = _linked_environment(tmp_path)
    monkeypatch.setattr(sys, "path", [*sys.path, str(site)])
    paths = sandbox.python_paths()
    assert str(site) in paths and str(store) in paths
    assert "/" not in paths  # a link to a folder holding the home is not followed


@needs_sandbox
def test_a_candidate_imports_a_package_linked_into_the_environment(tmp_path, monkeypatch):
    site, _ = _linked_environment(tmp_path / "env")
    monkeypatch.setattr(sys, "path", [*sys.path, str(site)])
    (tmp_path / "c").mkdir()
    (tmp_path / "k").mkdir()
    cmd, env = sandbox.Sandbox("bwrap").command(
        [sys.executable, "-c", "import linkedpkg; print(linkedpkg.VALUE)"], candidate=str(tmp_path / "c"),
        cache=str(tmp_path / "k"), env=dict(os.environ), extra_env={})
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "42", done.stderr[-2000:]


def test_without_bubblewrap_the_evaluator_refuses_with_the_install_hint(monkeypatch):
    monkeypatch.setenv(sandbox.BWRAP_ENV, "/nonexistent/bwrap")
    reason = sandbox.unavailable_reason.__wrapped__()
    assert "does not run" in reason and "apt-get install bubblewrap" in reason and "--sandbox none" in reason
    monkeypatch.setattr("ksearch_graph.harness.parent.client.unavailable_reason", lambda: reason)
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        SubprocessEvaluator()
    SubprocessEvaluator(sandbox="none")  # explicit: runs, and its results say so


def test_the_judge_reads_the_cpu_time_of_a_whole_process_tree():
    """A forked worker's CPU time counts: through the cgroup (every process, exited ones too) where the host lets us
    make one, else through /proc (the live threads of the tree)."""
    burn = "import os, time\npid = os.fork()\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n" \
           "if pid: os.waitpid(pid, 0)\nelse: time.sleep(0.5); os._exit(0)\n"
    for group in (CpuGroup.make(), None):
        account = CpuAccount(group)
        proc = subprocess.Popen(account.join_command([sys.executable, "-c", burn]))
        account.attach(proc.pid)
        time.sleep(0.25)
        during = account.cpu_us()
        proc.wait()
        if group is not None:  # after the exit: still counted (it is the cgroup's)
            assert account.cpu_us() >= 0.55e6, account.cpu_us()
        assert during >= 0.2e6, (account.kind, during)  # both processes burning, seen mid-way
        account.close()


def test_a_process_tree_lists_the_descendants():
    proc = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                             "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3)']); time.sleep(3)"])
    try:
        deadline = time.monotonic() + 5
        while len(ProcessTree(proc.pid).pids()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(ProcessTree(proc.pid).pids()) == 2
    finally:
        for pid in ProcessTree(proc.pid).pids():
            os.kill(pid, 9)
        proc.wait()


# --- a candidate written to do harm (slow: whole evaluations) --------------------------------------------------------


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    import shutil

    folder = tmp_path_factory.mktemp("sandbox-task") / "task"
    shutil.copytree(CHEATS / "task", folder)
    return load_task(folder)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _marked(folders, mark: str) -> list[str]:
    """Files under ``folders`` (not recursing into big trees) whose name or first bytes carry ``mark``."""
    hits = []
    for folder in folders:
        for path in Path(folder).glob("*"):
            try:
                if path.is_file() and (path.name.startswith(("zz_ksearch", "ksearch_planted"))
                                       or mark.encode() in path.read_bytes()[:4096]):
                    hits.append(str(path))
            except OSError:
                continue
    return hits


@pytest.mark.slow
@needs_sandbox
def test_a_candidate_plants_nothing_that_outlives_its_evaluation(task, tmp_path):
    import site
    import sysconfig

    mark = f"ksearch-planted-{os.getpid()}"
    compare = HARNESS / "compare.py"
    before = _digest(compare)
    cache = tmp_path / "cache"
    ev = SubprocessEvaluator(timeout_s=120, time_budget_s=0.05, cache_dir=str(cache))
    r = ev.evaluate(task, cheat("plant_files", MARKER=str(os.getpid())), attempt_id="plant")
    assert r.status == Status.passed, explain(r)
    assert _digest(compare) == before
    folders = {p for p in sys.path if p and os.path.isdir(p)} | set(site.getsitepackages()) | {
        sysconfig.get_paths()["purelib"], "/tmp", os.path.expanduser("~")}
    assert _marked(folders, mark) == []
    assert not os.path.exists(os.path.expanduser("~/.bashrc")) or mark not in Path(
        os.path.expanduser("~/.bashrc")).read_text(errors="replace")
    planted = [str(p) for p in cache.rglob("*") if p.is_file() and mark.encode() in p.read_bytes()[:4096]]
    # What it wrote into its own compile cache stays with its own source (restored only to evaluations of the same
    # files): no other source's entry, nothing in the judge's own cache.
    keys = {Path(p).relative_to(cache).parts[:2] for p in planted}
    assert len(keys) <= 1 and all(k[0] == "by-source" for k in keys), planted
    zeros = ev.evaluate(task, {"kernel.py": (CHEATS / "zeros.py").read_text()}, attempt_id="after")
    assert zeros.status != Status.passed, explain(zeros)


@pytest.mark.slow
@needs_sandbox
def test_no_secret_outside_the_allow_list_reaches_the_result(task, tmp_path):
    home = tmp_path / "home"
    for name, text in {".netrc": "machine h login u password ksearch-secret-netrc",
                       ".aws/credentials": "[default]\naws_secret_access_key = ksearch-secret-aws",
                       ".cache/huggingface/token": "ksearch-secret-hf-token",
                       "gcp.json": '{"private_key": "ksearch-secret-gcp"}'}.items():
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text(text)
    other = tmp_path / "work" / "ksearch-eval-earlier" / "candidate"
    other.mkdir(parents=True)
    (other / "kernel.py").write_text("# ksearch-secret-other-candidate\n")
    env = {"HOME": str(home), "DATABASE_URL": "postgres://u:ksearch-secret-db@h/db", "HF_AUTH": "ksearch-secret-hf",
           "GOOGLE_APPLICATION_CREDENTIALS": str(home / "gcp.json")}
    ev = SubprocessEvaluator(timeout_s=120, time_budget_s=0.05, env=env, workdir=str(tmp_path / "work"))
    r = ev.evaluate(task, cheat("read_secrets", **{'HOST_HOME = "/nonexistent"': f'HOST_HOME = "{home}"'}), attempt_id="secrets")
    everything = r.model_dump_json()
    assert "ksearch-secret" not in everything, explain(r)
    assert r.status == Status.passed, explain(r)
    assert r.environment["isolation"].startswith("bwrap")


@pytest.mark.slow
@needs_sandbox
def test_a_candidate_kills_no_neighbour(task):
    """An honest evaluation runs; once its candidate's process is up, a hostile one starts beside it and signals
    every harness process it can see."""
    honest = {"kernel.py": (CHEATS / "honest.py").read_text()}
    ev = SubprocessEvaluator(timeout_s=120, time_budget_s=0.5)
    victim: dict = {}
    worker = threading.Thread(target=lambda: victim.setdefault("r", ev.evaluate(task, honest, attempt_id="victim")))
    worker.start()
    deadline = time.monotonic() + 60
    while not _runner_pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _runner_pids(), "the victim's candidate process never started"
    attacker = SubprocessEvaluator(timeout_s=120, time_budget_s=0.05).evaluate(task, cheat("kill_neighbours"),
                                                                             attempt_id="attacker")
    worker.join(180)
    assert victim["r"].status == Status.passed, explain(victim["r"])
    assert attacker.status == Status.passed, explain(attacker)


def _runner_pids() -> list[int]:
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if b"runner.py" in cmdline.read_bytes():
                pids.append(int(cmdline.parent.name))
        except (OSError, ValueError):
            continue
    return pids


@pytest.mark.slow
@needs_sandbox
def test_the_judge_acts_on_no_address_a_candidate_names(task):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    r = SubprocessEvaluator(timeout_s=120, time_budget_s=0.05).evaluate(
        task, cheat("address_message", **{r"LISTEN_PORT = 9": f"LISTEN_PORT = {port}"}), attempt_id="address")
    assert r.status == Status.suspicious, explain(r)
    assert "protocol does not allow" in r.log_excerpt
    assert r.environment["judge_network_isolated"] == "yes"
    with pytest.raises(BlockingIOError):
        listener.accept()
    listener.close()
