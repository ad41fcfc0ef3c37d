"""A run directory: everything one search needs, self-contained so it can be copied and resumed elsewhere.

    DIR/run.json            settings (SearchConfig), thread id, where it was branched from
    DIR/task/               a copy of the task folder (the run does not depend on the original)
    DIR/checkpoints.sqlite  LangGraph's SqliteSaver: the graph state at every step
    DIR/store.sqlite        the artifact DB (attempts, sources, world-model snapshots, events, ledger)
    DIR/best/               the best kernel, written when the run finishes
    DIR/writer.lock         held (flock) by the one process writing the run (run_lock.py)

Paths inside are relative, API keys are never written (only the name of the variable holding one).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from langgraph.checkpoint.sqlite import SqliteSaver
from pydantic import ValidationError

from ksearch_graph.config import SearchConfig
from ksearch_graph.rundir.run_lock import RunLock, writer_active
from ksearch_graph.rundir.sqlite_snapshot import NoDatabase, open_read_only
from ksearch_graph.rundir.store import RunStore
from ksearch_graph.tasks.task import Task, load_task

RUN_FILE = "run.json"


class RunDirError(ValueError):
    pass


@dataclass
class RunDir:
    path: Path
    config: SearchConfig
    thread_id: str
    branched_from: dict | None = None
    lock: RunLock | None = None  # held while this process is the run's writer
    # A reader's view (show, history, report, export, a branch's source): the databases are read without creating
    # or changing any file in the run directory (sqlite_snapshot.py).
    read_only: bool = False

    # ------------------------------------------------------------------ create / open

    @classmethod
    def create(cls, path: str | Path, task_folder: str | Path, config: SearchConfig,
               *, branched_from: dict | None = None, writer: bool = False) -> RunDir:
        """A new run directory, made whole or not at all (see ``building``). ``writer``: keep holding its lock."""
        with cls.building(path, task_folder, config, branched_from=branched_from) as run:
            pass
        if not writer:
            run.lock.release()
            run.lock = None
        return run

    @classmethod
    @contextmanager
    def building(cls, path: str | Path, task_folder: str | Path, config: SearchConfig,
                 *, branched_from: dict | None = None) -> Iterator[RunDir]:
        """A new run directory, built in a hidden folder beside ``path`` (the task copied, run.json and the store
        written, then whatever the block adds) and renamed into place when the block ends without error. On any
        error, a full disk included, nothing is left behind: no half-made directory for ``resume`` to refuse.
        The run is locked for this process (its writer) from the start; the block must close what it opens there."""
        path = Path(path)
        if (path / RUN_FILE).exists():
            raise RunDirError(f"{path} already holds a run; use `ksearch resume {path}` or another --run-dir")
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise RunDirError(f"{path} exists and holds no run (no {RUN_FILE}); choose another --run-dir, or empty it")
        made = _missing_parents(path.parent)
        staging = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            staging = path.parent / f".{path.name}.new-{uuid.uuid4().hex[:8]}"
            staging.mkdir()
            lock = RunLock(staging).acquire()
            run = cls(path=staging, config=config, thread_id=uuid.uuid4().hex[:12], branched_from=branched_from,
                      lock=lock)
            try:
                copy_folder(Path(task_folder), staging / "task")
                run.save()
                yield run
                _publish(staging, path)
            except BaseException:
                lock.release()
                raise
        except BaseException:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
            for folder in made:  # the parents this call made, deepest first, if still empty
                with contextlib.suppress(OSError):
                    folder.rmdir()
            raise
        run.path = path
        run.lock.path = path / run.lock.path.name

    @classmethod
    def open(cls, path: str | Path, *, writer: bool = False, read_only: bool = False) -> RunDir:
        """An existing run directory. ``writer``: take its lock (RunLocked if another process holds it);
        ``read_only``: a reader's view, which writes nothing."""
        path = Path(path)
        manifest = path / RUN_FILE
        if not manifest.is_file():
            raise RunDirError(f"{path} is not a run directory (no {RUN_FILE})")
        lock = RunLock(path).acquire() if writer else None
        try:
            run = cls.from_manifest(path, json.loads(manifest.read_bytes()), lock=lock)
            run.read_only = read_only
            return run
        except (ValueError, KeyError, TypeError) as e:  # JSONDecodeError and ValidationError are ValueErrors
            lock and lock.release()
            raise RunDirError(f"{manifest} is damaged ({_first_line(e)}); `ksearch recover {path}` restores it "
                              "from the copy in store.sqlite") from None

    @classmethod
    def from_manifest(cls, path: Path, data: dict, *, lock: RunLock | None = None) -> RunDir:
        return cls(path=path, config=SearchConfig.model_validate(data["config"]), thread_id=data["thread_id"],
                   branched_from=data.get("branched_from"), lock=lock)

    def manifest(self) -> dict:
        return {
            "format": 1,
            "thread_id": self.thread_id,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "branched_from": self.branched_from,
            "config": self.config.model_dump(mode="json"),
        }

    def save(self) -> None:
        """Write run.json, checked first and replaced atomically (write, fsync, rename): a crash or a full disk
        leaves the old file or the new one, never a mix. A copy goes into store.sqlite for ``ksearch recover``."""
        try:
            SearchConfig.model_validate(self.config.model_dump())
        except ValidationError as e:
            raise RunDirError(f"refusing to save invalid settings: {_first_line(e)}") from None
        data = self.manifest()
        write_atomically(self.path / RUN_FILE, json.dumps(data, indent=2))
        store = self.store()
        try:
            store.set_meta("run_json", data)
        finally:
            store.close()

    # ------------------------------------------------------------------ parts

    def task(self) -> Task:
        return load_task(self.path / "task")

    def store(self) -> RunStore:
        """The run's store. One that is missing or empty beside checkpoints is never created afresh: that would
        hide the loss of every recorded attempt (a reader would make it, a writer then trust it)."""
        path, checkpoints = self.path / "store.sqlite", self.path / "checkpoints.sqlite"
        missing = not path.exists() or path.stat().st_size == 0
        if missing and checkpoints.exists() and checkpoints.stat().st_size:
            raise RunDirError(f"{path} is {'missing' if not path.exists() else 'empty'}, though the run has "
                              "checkpoints: it is the only full record of the attempts; restore it from a copy of "
                              f"the run directory, or see `ksearch recover {self.path}`")
        if self.read_only:
            if missing:
                raise RunDirError(f"{path} is {'missing' if not path.exists() else 'empty'}: this run has no "
                                  f"record to read (`ksearch resume {self.path}` starts it)")
            return RunStore.reader(path, live=writer_active(self.path))
        return RunStore(path)

    def checkpointer(self) -> SqliteSaver:
        path = self.path / "checkpoints.sqlite"
        if not self.read_only:
            return SqliteSaver(sqlite3.connect(str(path), check_same_thread=False))
        try:
            saver = SqliteSaver(open_read_only(path, live=writer_active(self.path)))
            saver.is_setup = True  # its tables exist; setting them up would write
        except NoDatabase:  # nothing checkpointed yet: an empty one, in memory
            saver = SqliteSaver(sqlite3.connect(":memory:", check_same_thread=False))
        return saver

    def graph_config(self, checkpoint_id: str | None = None) -> dict:
        configurable = {"thread_id": self.thread_id}
        if checkpoint_id:
            configurable["checkpoint_id"] = checkpoint_id
        return {"configurable": configurable, "recursion_limit": 100_000}


def copy_folder(src: Path, dst: Path) -> None:
    """Copy a task folder (caches left out), stopping at the first error with it as it is (``shutil.copytree``
    would gather them into one list, and a full disk's errno with them)."""
    dst.mkdir()
    for item in sorted(src.iterdir()):
        if item.name == "__pycache__" or item.suffix == ".pyc":
            continue
        if item.is_dir():
            copy_folder(item, dst / item.name)
        else:
            shutil.copy2(item, dst / item.name)


def _missing_parents(folder: Path) -> list[Path]:
    """The folders of ``folder``'s path that do not exist yet, deepest first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def _publish(staging: Path, path: Path) -> None:
    """Rename the finished run directory into place (onto an empty folder there, if one is)."""
    try:
        os.rename(staging, path)
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
            raise RunDirError(f"{path} already holds a run (made meanwhile by another process); use another "
                              "--run-dir") from None
        raise
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)  # the rename itself reaches the disk
    finally:
        os.close(folder)


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)  # the rename itself reaches the disk
    finally:
        os.close(folder)


def _first_line(e: Exception) -> str:
    if isinstance(e, ValidationError):
        err = e.errors()[0]
        return f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def copy_sqlite(src: Path, dst: Path) -> None:
    """Copy a (WAL-mode) SQLite file consistently, through SQLite's backup API, writing nothing beside ``src``."""
    a, b = open_read_only(src), sqlite3.connect(str(dst))
    try:
        a.backup(b)
    finally:
        a.close()
        b.close()
