"""A run directory: everything one search needs, self-contained so it can be copied and resumed elsewhere.

    DIR/run.json            settings (SearchConfig), thread id, where it was branched from
    DIR/task/               a copy of the task folder (the run does not depend on the original)
    DIR/checkpoints.sqlite  LangGraph's SqliteSaver: the graph state at every step
    DIR/store.sqlite        the artifact DB (attempts, sources, world-model snapshots, events, ledger)
    DIR/best/               the best kernel, written when the run finishes

Paths inside are relative, API keys are never written (only the name of the variable holding one).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from langgraph.checkpoint.sqlite import SqliteSaver

from .config import SearchConfig
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

    # ------------------------------------------------------------------ create / open

    @classmethod
    def create(cls, path: str | Path, task_folder: str | Path, config: SearchConfig,
               *, branched_from: dict | None = None) -> "RunDir":
        path = Path(path)
        if (path / RUN_FILE).exists():
            raise RunDirError(f"{path} already holds a run; use `ksearch resume {path}` or another --run-dir")
        path.mkdir(parents=True, exist_ok=True)
        shutil.copytree(task_folder, path / "task", dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        run = cls(path=path, config=config, thread_id=uuid.uuid4().hex[:12], branched_from=branched_from)
        run.save()
        return run

    @classmethod
    def open(cls, path: str | Path) -> "RunDir":
        path = Path(path)
        manifest = path / RUN_FILE
        if not manifest.is_file():
            raise RunDirError(f"{path} is not a run directory (no {RUN_FILE})")
        data = json.loads(manifest.read_text())
        return cls(path=path, config=SearchConfig.model_validate(data["config"]), thread_id=data["thread_id"],
                   branched_from=data.get("branched_from"))

    def save(self) -> None:
        data = {
            "format": 1,
            "thread_id": self.thread_id,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "branched_from": self.branched_from,
            "config": self.config.model_dump(mode="json"),
        }
        tmp = self.path / (RUN_FILE + ".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        tmp.replace(self.path / RUN_FILE)  # atomic: a crash never leaves a half-written run.json

    # ------------------------------------------------------------------ parts

    def task(self) -> Task:
        return load_task(self.path / "task")

    def store(self) -> RunStore:
        return RunStore(self.path / "store.sqlite")

    def checkpointer(self) -> SqliteSaver:
        conn = sqlite3.connect(str(self.path / "checkpoints.sqlite"), check_same_thread=False)
        return SqliteSaver(conn)

    def graph_config(self, checkpoint_id: str | None = None) -> dict:
        configurable = {"thread_id": self.thread_id}
        if checkpoint_id:
            configurable["checkpoint_id"] = checkpoint_id
        return {"configurable": configurable, "recursion_limit": 100_000}


def copy_sqlite(src: Path, dst: Path) -> None:
    """Copy a (WAL-mode) SQLite file consistently, through SQLite's backup API."""
    with sqlite3.connect(str(src)) as a, sqlite3.connect(str(dst)) as b:
        a.backup(b)
