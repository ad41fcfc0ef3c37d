"""Readers write nothing, a full disk is called full, and only proven damage suggests --start-over, at the CLI.

- show, history, report and export read a run (finished, killed with its WAL files left, or timed on a GPU with no
  work recorded, which a reader works out) without creating or changing any file in it, also on a full disk; on an emptied or deleted checkpoint file they stop and say so;
- on a full disk (a file-size limit of 0 bytes stands in for it) resume and recover say "full" and change nothing;
- both databases damaged: the message names both; a damaged store is never "rebuilt from" itself;
- a run that cannot be made (a disk that is full from the start) leaves nothing behind;
- the SQLite snapshot readers use: committed WAL frames applied, a torn or uncommitted tail ignored.
"""

from __future__ import annotations

import hashlib
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
from conftest import REPO, SOFTMAX, run_cli


def _wal_db(path: Path, rows: int) -> None:
    """A WAL database whose last writes are only in its WAL file (as a killed writer leaves it)."""
    code = (f"import os, sqlite3; db = sqlite3.connect({str(path)!r}); db.execute('pragma journal_mode=wal'); "
            "db.execute('pragma wal_autocheckpoint=0'); db.execute('create table t (x)'); db.commit(); "
            f"[(db.execute('insert into t values (?)', ('x' * 300,)), db.commit()) for _ in range({rows})]; "
            "os._exit(0)")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_snapshot_applies_committed_wal_frames_and_creates_nothing(tmp_path):
    from ksearch_graph.rundir.sqlite_snapshot import open_read_only, snapshot

    path = tmp_path / "db.sqlite"
    _wal_db(path, 50)
    (tmp_path / "db.sqlite-shm").unlink()  # no index: open_read_only reads the files themselves
    before = sorted(p.name for p in tmp_path.iterdir())
    db = open_read_only(path)
    assert db.execute("select count(*) from t").fetchone()[0] == 50
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    wal = tmp_path / "db.sqlite-wal"
    os.truncate(wal, wal.stat().st_size - 100)  # the last frame cut: its commit never happened
    assert snapshot(path).execute("select count(*) from t").fetchone()[0] == 49
    assert snapshot(path).execute("pragma quick_check").fetchone()[0] == "ok"


def _digest(run: Path) -> dict[str, str]:
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run.rglob("*")) if p.is_file()}


def _data(digest: dict[str, str]) -> dict[str, str]:
    return {name: h for name, h in digest.items() if not name.endswith("-shm")}


def _full_disk():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))


def _on_full_disk(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"} | {"PYTHONDONTWRITEBYTECODE": ""}
    return subprocess.run([sys.executable, "-m", "ksearch_graph.cli.main", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300, preexec_fn=_full_disk, env=env)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A finished run, and one killed with SIGKILL mid-search (its WAL files left beside the databases)."""
    base = tmp_path_factory.mktemp("readers")
    finished = base / "finished"
    run_cli("run", str(SOFTMAX), "--run-dir", str(finished), "--iterations", "2", "--stagnation-window", "3",
            "--quiet", check=True)
    killed = base / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "ksearch_graph.cli.main", "run", str(SOFTMAX), "--run-dir",
                             str(killed), "--iterations", "6", "--quiet"], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with closing(sqlite3.connect(f"file:{killed / 'store.sqlite'}?immutable=1", uri=True)) as db:
                if db.execute("select count(*) from attempts where prompt_kind != 'seed'").fetchone()[0] >= 2:
                    break
        except sqlite3.Error:
            pass
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (killed / "checkpoints.sqlite-wal").exists()
    return {"finished": finished, "killed": killed, "gpu timed": _as_if_timed_on_a_gpu(finished, base / "gpu")}


def _as_if_timed_on_a_gpu(source: Path, run: Path) -> Path:
    """A copy of ``source`` whose passing attempts read as timed on an H100, with no work recorded: a reader shows
    their fraction of the floor, working the task's work out from its reference.py (as for a run from before the
    work was recorded) without recording it or leaving bytecode beside it."""
    shutil.copytree(source, run)
    with closing(sqlite3.connect(run / "store.sqlite")) as db:
        for attempt_id, text in db.execute("select id, result from attempts where status = 'passed'").fetchall():
            result = json.loads(text)
            result["timing_representative"] = True
            result["environment"].update(device="cuda", gpu="NVIDIA H100 80GB HBM3", triton_interpret=False)
            db.execute("update attempts set result = ? where id = ?", (json.dumps(result), attempt_id))
        db.execute("delete from meta where key = 'workload_work'")
        db.commit()
        db.execute("pragma wal_checkpoint(truncate)")
    return run


READERS = (["show"], ["show", "--json"], ["history"], ["show", "--world-model"], ["show", "--attempt", "seed"])
BYTECODE = {"PYTHONDONTWRITEBYTECODE": ""}  # Python's default: it writes __pycache__ beside what it imports


@pytest.mark.slow
def test_readers_change_nothing_in_the_run_also_on_a_full_disk(runs, tmp_path):
    for name, run in runs.items():
        before = _digest(run)
        for reader in READERS:
            proc = run_cli(reader[0], str(run), *reader[1:], env=BYTECODE)
            assert proc.returncode == 0 and proc.stdout, (name, reader, proc.stderr)
            full = _on_full_disk(reader[0], str(run), *reader[1:])
            # Working the work out needs torch's temporary directory, which a full disk denies: the floor is unknown
            # then, and everything else reads the same.
            same = full.stdout == proc.stdout or name == "gpu timed" and full.stdout
            assert full.returncode == 0 and same, (name, reader, full.stderr)
        run_cli("report", str(run), "--out", str(tmp_path / name / "report"), env=BYTECODE, check=True)
        run_cli("export", str(run), "--out", str(tmp_path / name / "export"), env=BYTECODE, check=True)
        run_cli("export", str(run), "--format", "flashinfer-trace", "--out", str(tmp_path / name / "trace"),
                env=BYTECODE, check=True)
        assert _digest(run) == before, name  # no -wal/-shm made, no schema written, no byte changed
        assert not list(run.rglob("__pycache__")), name  # the task's reference was imported without bytecode
    assert "of the speed-of-light floor on H100" in run_cli("show", str(runs["gpu timed"])).stdout


@pytest.mark.slow
def test_readers_stop_on_an_emptied_or_deleted_checkpoint_file(runs, tmp_path):
    for damage in ("emptied", "deleted"):
        run = tmp_path / damage
        shutil.copytree(runs["finished"], run)
        path = run / "checkpoints.sqlite"
        os.truncate(path, 0) if damage == "emptied" else path.unlink()
        before = _digest(run)
        for command in ("show", "history", "report"):
            proc = run_cli(command, str(run))
            what = "is empty" if damage == "emptied" else "is missing"
            assert proc.returncode == 2 and f"checkpoints.sqlite {what}" in proc.stderr, (command, proc.stderr)
            assert f"ksearch recover {run}" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert _digest(run) == before  # no schema written into it, nothing created


@pytest.mark.slow
def test_a_full_disk_is_called_full_never_damaged(runs, tmp_path):
    for name, source in ((n, runs[n]) for n in ("finished", "killed")):
        run = tmp_path / name
        shutil.copytree(source, run)
        before = _digest(run)
        for command in (["resume", str(run), "--more", "1"], ["recover", str(run)]):
            proc = _on_full_disk(*command)
            if name == "killed" and command[0] == "recover":  # its index exists: the check reads, nothing to do
                assert proc.returncode in (0, 74) and "damaged" not in proc.stdout + proc.stderr, proc.stderr
                continue
            assert proc.returncode == 74 and "the disk is full" in proc.stderr, (name, command, proc.stderr)
            assert "damaged" not in proc.stderr and "--start-over" not in proc.stderr, proc.stderr
        # Every byte of data stays; a writer opening a killed run's database may rebuild its -shm index (SQLite's
        # shared memory, which holds no data) in place.
        assert _data(_digest(run)) == _data(before), name
        run_cli("resume", str(run), "--more", "1", "--quiet", check=True)  # space is back


@pytest.mark.slow
def test_messages_name_what_is_damaged(runs, tmp_path):
    run = tmp_path / "both"
    shutil.copytree(runs["finished"], run)
    for name in ("checkpoints.sqlite", "store.sqlite"):
        (run / name).write_bytes(b"this is not a database" * 500)
    proc = run_cli("resume", str(run))
    assert proc.returncode == 2 and "store.sqlite is damaged" in proc.stderr \
        and "checkpoints.sqlite is damaged too" in proc.stderr and "--start-over" in proc.stderr, proc.stderr
    run = tmp_path / "store"
    shutil.copytree(runs["finished"], run)
    (run / "store.sqlite").write_bytes(b"this is not a database" * 500)
    for command in ("show", "resume", "recover"):
        proc = run_cli(command, str(run))
        assert proc.returncode == 2 and "store.sqlite is damaged" in proc.stderr, (command, proc.stderr)
        assert "rebuilds the run from store.sqlite" not in proc.stderr and "restore it from a copy" in proc.stderr


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None, reason="needs root to mount a small tmpfs")
def test_a_run_that_cannot_be_made_leaves_nothing_behind(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        with open(disk / "fill", "wb") as f:  # the disk is full before the run starts
            with pytest.raises(OSError):
                f.write(bytes(2 << 20))
        proc = run_cli("run", str(SOFTMAX), "--run-dir", str(disk / "run"), "--iterations", "1", "--quiet")
        assert proc.returncode == 74 and "the disk is full" in proc.stderr and "Traceback" not in proc.stderr
        assert "Nothing was left behind" in proc.stderr and "the same `ksearch run` again" in proc.stderr
        assert sorted(p.name for p in disk.iterdir()) == ["fill"]
        (disk / "fill").unlink()
        run_cli("run", str(SOFTMAX), "--run-dir", str(disk / "run"), "--iterations", "1", "--quiet", check=True)
    finally:
        subprocess.run(["umount", str(disk)])
