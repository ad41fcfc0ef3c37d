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

import json
import os
import shutil
import sqlite3
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from langgraph.checkpoint.sqlite import SqliteSaver

from pydantic import ValidationError

from .config import SearchConfig
from .run_lock import RunLock
from .store import RunStore
from .task import Task, load_task

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

    # ------------------------------------------------------------------ create / open

    @classmethod
    def create(cls, path: str | Path, task_folder: str | Path, config: SearchConfig,
               *, branched_from: dict | None = None, writer: bool = False) -> "RunDir":
        """A new run directory. ``writer``: hold its lock from before anything is written."""
        path = Path(path)
        if (path / RUN_FILE).exists():
            raise RunDirError(f"{path} already holds a run; use `ksearch resume {path}` or another --run-dir")
        path.mkdir(parents=True, exist_ok=True)
        lock = RunLock(path).acquire() if writer else None
        if (path / RUN_FILE).exists():  # created by the process that held the lock before us
            lock and lock.release()
            raise RunDirError(f"{path} already holds a run; use `ksearch resume {path}` or another --run-dir")
        shutil.copytree(task_folder, path / "task", dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        run = cls(path=path, config=config, thread_id=uuid.uuid4().hex[:12], branched_from=branched_from, lock=lock)
        run.save()
        return run

    @classmethod
    def open(cls, path: str | Path, *, writer: bool = False) -> "RunDir":
        """An existing run directory. ``writer``: take its lock (RunLocked if another process holds it)."""
        path = Path(path)
        manifest = path / RUN_FILE
        if not manifest.is_file():
            raise RunDirError(f"{path} is not a run directory (no {RUN_FILE})")
        lock = RunLock(path).acquire() if writer else None
        try:
            return cls.from_manifest(path, json.loads(manifest.read_bytes()), lock=lock)
        except (ValueError, KeyError, TypeError) as e:  # JSONDecodeError and ValidationError are ValueErrors
            lock and lock.release()
            raise RunDirError(f"{manifest} is damaged ({_first_line(e)}); `ksearch recover {path}` restores it "
                              "from the copy in store.sqlite") from None

    @classmethod
    def from_manifest(cls, path: Path, data: dict, *, lock: RunLock | None = None) -> "RunDir":
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
        if (not path.exists() or path.stat().st_size == 0) and checkpoints.exists() and checkpoints.stat().st_size:
            raise RunDirError(f"{path} is {'missing' if not path.exists() else 'empty'}, though the run has "
                              "checkpoints: it is the only full record of the attempts; restore it from a copy of "
                              f"the run directory, or see `ksearch recover {self.path}`")
        return RunStore(path)

    def checkpointer(self) -> SqliteSaver:
        conn = sqlite3.connect(str(self.path / "checkpoints.sqlite"), check_same_thread=False)
        return SqliteSaver(conn)

    def graph_config(self, checkpoint_id: str | None = None) -> dict:
        configurable = {"thread_id": self.thread_id}
        if checkpoint_id:
            configurable["checkpoint_id"] = checkpoint_id
        return {"configurable": configurable, "recursion_limit": 100_000}


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
    """Copy a (WAL-mode) SQLite file consistently, through SQLite's backup API."""
    with sqlite3.connect(str(src)) as a, sqlite3.connect(str(dst)) as b:
        a.backup(b)
