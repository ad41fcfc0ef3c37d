"""Is a run directory safe to continue, or to read? Checked every time a run is opened for writing
(``check_for_writing``) and by the readers (``open_for_reading``: show, history, report, export, a branch's source),
which find and say the same without creating or changing any file (sqlite_snapshot.py).

Both databases must pass ``PRAGMA quick_check``, and the two must tell the same story:
- the checkpoints must know every cycle the store has attempts or generations for; a checkpoint file that is
  missing, empty or older than that would start those cycles again (a new search on top of the old one);
- the store must hold what the checkpoints refer to (the merged cycles' attempts, the code of the best kernel and
  of every attempt a checkpoint names, the cycles in flight included).
A missing, empty or damaged store.sqlite cannot be rebuilt (it alone holds the attempts' code): the run stops.
The store may be ahead of the checkpoints by the step in flight at a kill: nodes re-run against it idempotently.

A file that cannot be opened for writing (SQLite's "disk I/O error" on a full disk, a read-only folder) is not
damaged: it is checked again read-only, from its bytes; when that finds it sound, the command stops as for a full
disk or a read-only directory (``StorageUnavailable``, exit code 74) and never suggests ``--start-over``, which only
a check that proves damage does.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import sqlite3
import struct
import time
from pathlib import Path

from ksearch_graph.rundir.run_dir import RunDir, RunDirError
from ksearch_graph.rundir.run_lock import writer_active
from ksearch_graph.rundir.sqlite_snapshot import open_read_only, snapshot

_CYCLE_NUMBER = re.compile(r"(?:^|:)c(\d+)[a-z]?(?:[.:]|$)")


class DamagedRun(RunDirError):
    """The run directory cannot be continued as it is; the message says what was found and what to do."""


class StorageUnavailable(OSError):
    """A sound database that cannot be opened for writing: a full disk, a file-size limit, a read-only folder."""


_IO_WORDS = ("disk i/o error", "unable to open database file", "readonly", "read-only", "disk is full")


def quick_check(path: Path, *, writer: bool = False) -> str | None:
    """None when the SQLite file is sound, else what SQLite says is wrong with it.

    ``writer`` (the caller holds the run's lock): a shared-memory index (``-shm``) that no longer matches its
    WAL file (a WAL lost or cut after a crash) reads as an I/O error; it holds no data, so it is dropped and
    the file checked again, SQLite rebuilding the index from what the WAL really holds.
    """
    if writer:
        drop_stale_index(path)
    problem = _quick_check(path)
    index = path.with_name(path.name + "-shm")
    if problem and writer and "disk i/o error" in problem.lower() and index.exists() \
            and write_probe(path.parent) is None:  # on a full disk the error is the disk's: the index stays
        index.unlink()
        problem = _quick_check(path)
    return problem


def write_probe(folder: Path) -> OSError | None:
    """Write (and remove) a small file in ``folder``: None when that works, else the error (a full disk, a
    read-only folder)."""
    probe = folder / f".ksearch-write-check-{os.getpid()}"
    try:
        with open(probe, "wb") as f:
            f.write(bytes(1 << 16))
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        return e
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return None


def drop_stale_index(path: Path) -> None:
    """Delete a ``-shm`` index that counts more WAL frames than the WAL file holds (the WAL was lost, emptied or
    cut after a crash). SQLite would trust it and write its next frames after a hole, which damages the
    database for every later reader. The index holds no data; SQLite rebuilds it from the WAL."""
    index, wal = path.with_name(path.name + "-shm"), path.with_name(path.name + "-wal")
    if not index.exists():
        return
    try:
        header = index.read_bytes()[:48]
        counted = struct.unpack("=I", header[16:20])[0] if len(header) >= 20 else 0
        frames = 0
        if wal.exists() and wal.stat().st_size >= 32:
            page = struct.unpack(">I", wal.read_bytes()[8:12])[0]
            frames = (wal.stat().st_size - 32) // (page + 24) if page else 0
    except OSError:
        return
    if counted > frames:
        index.unlink()


def _quick_check(path: Path) -> str | None:
    db = sqlite3.connect(str(path), timeout=30)
    try:
        rows = [r[0] for r in db.execute("pragma quick_check").fetchall()]
    except sqlite3.DatabaseError as e:
        return str(e)
    finally:
        db.close()
    return None if rows == ["ok"] else "; ".join(rows[:3])


def snapshot_problem(path: Path) -> str | None:
    """``quick_check`` of the file's own bytes (and its WAL's committed frames), read into memory: nothing is
    opened for writing, so only damage shows."""
    try:
        db = snapshot(path)
    except sqlite3.DatabaseError as e:
        return str(e)
    except OSError as e:
        return f"unreadable: {e}"
    try:
        rows = [r[0] for r in db.execute("pragma quick_check").fetchall()]
    except sqlite3.DatabaseError as e:
        return str(e)
    finally:
        db.close()
    return None if rows == ["ok"] else "; ".join(rows[:3])


def database_problem(path: Path, *, reader: bool, live: bool = False) -> str | None:
    """What is wrong with a SQLite file of the run (None when sound). A writer whose check fails for want of disk
    or write access gets StorageUnavailable when the file's bytes are sound. A reader checks the bytes, or, while
    the run's writer is at work (``live``), reads through the writer's index (sqlite_snapshot.py)."""
    if reader and live:
        try:
            db = open_read_only(path, live=True)
            rows = [r[0] for r in db.execute("pragma quick_check").fetchall()]
            db.close()
            return None if rows == ["ok"] else "; ".join(rows[:3])
        except sqlite3.DatabaseError as e:
            return str(e)
    if reader:
        return snapshot_problem(path)
    siblings = [path.with_name(path.name + tail) for tail in ("-wal", "-shm")]
    existed = [p.exists() for p in siblings]
    problem = quick_check(path, writer=True)
    if problem and any(w in problem.lower() for w in _IO_WORDS) and snapshot_problem(path) is None:
        for sibling, was in zip(siblings, existed):  # what the failed open left: empty files it could not fill
            with contextlib.suppress(OSError):
                if not was and sibling.stat().st_size == 0:
                    sibling.unlink()
        raise storage_unavailable(path, problem)
    return problem


def storage_unavailable(path: Path, problem: str) -> StorageUnavailable:
    """Why ``path`` cannot be written, found by writing a small file beside it (then removed)."""
    e = write_probe(path.parent)
    if e is not None:
        return StorageUnavailable(e.errno, f"{path.name} cannot be opened for writing ({problem}; writing beside it: "
                                           f"{e.strerror}); its content is sound")
    return StorageUnavailable(errno.EIO, f"{path.name} cannot be opened for writing ({problem}), though its content "
                                         "is sound and the folder takes a new file; nothing was changed. Check the "
                                         "disk (dmesg), then try again")


def checkpoint_values(run: RunDir) -> dict | None:
    """The main graph's latest state in checkpoints.sqlite, or None when there is none (or no file)."""
    path = run.path / "checkpoints.sqlite"
    if not path.exists() or path.stat().st_size == 0:
        return None
    saver = run.checkpointer()
    try:
        found = saver.get_tuple({"configurable": {"thread_id": run.thread_id, "checkpoint_ns": ""}})
    finally:
        saver.conn.close()
    return dict(found.checkpoint["channel_values"]) if found else None


def store_cycle_numbers(db: sqlite3.Connection) -> set[int]:
    """The numbers of every cycle the store has an attempt or a cached generation of (c3, c3b -> 3)."""
    keys = _column(db, "select cycle_id from attempts") + _column(db, "select key from generations")
    return {int(m.group(1)) for k in keys if k and (m := _CYCLE_NUMBER.search(k))}


def store_problem(path: Path, *, reader: bool = False, live: bool = False) -> str | None:
    """What is wrong with store.sqlite ("is missing", "is empty", "is damaged (...)"), or None when it is sound.
    A missing or empty store is never opened: SQLite would discard or misread the WAL files left beside it."""
    if not path.exists():
        return "is missing"
    if path.stat().st_size == 0:
        return "is empty"
    problem = database_problem(path, reader=reader, live=live)
    return f"is damaged ({problem})" if problem else None


def store_lost(run_path: Path, problem: str, *, also: str = "") -> DamagedRun:
    also = f" {also}" if also else ""
    return DamagedRun(f"{run_path / 'store.sqlite'} {problem}.{also} It is the only full record of the attempts and "
                      "their code, so nothing can be rebuilt without it: restore it from a copy of the run "
                      f"directory, or `ksearch recover {run_path} --start-over` keeps the settings and the task, moves "
                      "the damaged files aside and starts the search again (the attempts recorded so far are lost)")


def set_aside(run_path: Path, names: list[str], aside: Path | None = None) -> list[str]:
    """Move these files of the run directory into ``aside`` (DIR/damaged-<time>/; never deleted); returns where
    they went."""
    aside = aside or run_path / f"damaged-{time.strftime('%Y%m%d-%H%M%S')}"
    moved = []
    for name in names:
        if (run_path / name).exists():
            aside.mkdir(exist_ok=True)
            (run_path / name).replace(aside / name)
            moved.append(str(aside / name))
    return moved


def check_for_writing(run: RunDir) -> None:
    """Raise DamagedRun unless the run can be continued as it is (StorageUnavailable when it cannot be written)."""
    _check(run, reader=False)


def open_for_reading(path: str | Path) -> RunDir:
    """The run as a reader sees it (nothing in it created or changed), checked as a writer would check it: a damaged,
    missing, emptied or outdated database stops the reader with what was found and what to do (DamagedRun)."""
    run = RunDir.open(path, read_only=True)
    _check(run, reader=True)
    return run


def _check(run: RunDir, *, reader: bool) -> None:
    recover = f"`ksearch recover {run.path}` rebuilds the checkpoints from store.sqlite (every evaluated " \
              "attempt, the last world model, budgets and tokens) and keeps the damaged file aside"
    store_path, checkpoint_path = run.path / "store.sqlite", run.path / "checkpoints.sqlite"
    live = reader and writer_active(run.path)
    checkpoints_damaged = None
    if checkpoint_path.exists() and checkpoint_path.stat().st_size:
        checkpoints_damaged = database_problem(checkpoint_path, reader=reader, live=live)
    if checkpoints_damaged:
        lost = store_problem(store_path, reader=reader, live=live)
        if lost:  # both: nothing to rebuild from
            raise store_lost(run.path, lost, also=f"{checkpoint_path} is damaged too ({checkpoints_damaged}).")
        raise DamagedRun(f"{checkpoint_path} is damaged ({checkpoints_damaged}); {recover}")
    values = checkpoint_values(run)
    if not store_path.exists() or store_path.stat().st_size == 0:
        if values:
            raise store_lost(run.path, store_problem(store_path))
        if not reader:
            set_aside(run.path, ["store.sqlite-wal", "store.sqlite-shm"])  # a WAL without its database: unusable
        return
    problem = store_problem(store_path, reader=reader, live=live)
    if problem:
        raise store_lost(run.path, problem)
    db = open_read_only(store_path, live=live) if reader else sqlite3.connect(str(store_path), timeout=30)
    try:
        numbers = store_cycle_numbers(db)
        lost = _missing_from_store(db, values or {}, checkpoint_references(run))
        known = _claimed_in_known_rounds(db, (values or {}).get("cycle_seq", 0))
        searched = bool(_column(db, "select 1 from world_models limit 1"))
    finally:
        db.close()
    ahead = sorted(n for n in numbers if n > known)
    if reader and values is None and not searched:
        ahead = []  # attempts put into a store no search has run on (no world model yet): nothing to lose
    if ahead:
        if not checkpoint_path.exists():
            what = "is missing"
        elif checkpoint_path.stat().st_size == 0:
            what = "is empty"
        elif values is None:
            what = "holds no state of this run"
        else:
            what = f"is older than store.sqlite (it knows {known} cycles, the store has attempts of cycle {ahead[-1]})"
        harm = "the run's state cannot be read from it" if reader else \
            "continuing would start the search again on top of the recorded one"
        raise DamagedRun(f"{checkpoint_path} {what}: {harm}. {recover}")
    if lost:
        raise DamagedRun(f"{store_path} lacks what the checkpoints refer to ({lost}): it is older than them (a lost "
                         f"WAL file?). `ksearch recover {run.path}` continues from what the store still holds")


def _claimed_in_known_rounds(db: sqlite3.Connection, known: int) -> int:
    """Rolling cycles: a lane claims its next cycle in the store (a ``merge:<cycle>`` record) before any checkpoint
    counts it. Cycles claimed in a round the checkpoints launched are known; a round they never saw is not."""
    for (payload,) in db.execute("select payload from generations where key like 'merge:%'") \
            if _column(db, "select 1 from sqlite_master where name = 'generations'") else []:
        record = json.loads(payload)
        round_number = _CYCLE_NUMBER.search(str(record.get("round", "")))
        if round_number and int(round_number.group(1)) <= known:
            known = max(known, int((record.get("state") or {}).get("cycle_seq") or 0))
    return known


def checkpoint_references(run: RunDir) -> set[str]:
    """Every code hash that the latest checkpoint of each graph namespace (the main graph and every cycle, the
    ones in flight included) and its pending writes refer to."""
    path = run.path / "checkpoints.sqlite"
    if not path.exists() or path.stat().st_size == 0:
        return set()
    saver = run.checkpointer()
    found: set[str] = set()
    try:
        namespaces = _column(saver.conn, "select distinct checkpoint_ns from checkpoints where thread_id = ?",
                             [run.thread_id])
        for ns in namespaces:
            latest = saver.get_tuple({"configurable": {"thread_id": run.thread_id, "checkpoint_ns": ns}})
            if latest:
                _collect_hashes(latest.checkpoint["channel_values"], found)
                _collect_hashes([w[2] for w in latest.pending_writes or []], found)
    finally:
        saver.conn.close()
    return found


def _collect_hashes(value, found: set[str]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            if key.endswith("source_hash") and isinstance(item, str) and item:
                found.add(item)
            else:
                _collect_hashes(item, found)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _collect_hashes(item, found)


def _missing_from_store(db: sqlite3.Connection, values: dict, hashes: set[str]) -> str | None:
    merged = [c for c in values.get("merged_cycles", []) if c != "seed"]
    have = set(_column(db, "select distinct cycle_id from attempts"))
    absent = [c for c in merged if c not in have]
    if absent:
        return "no attempts of cycle(s) " + ", ".join(absent[:5])
    best = values.get("best") or {}
    if best.get("source_hash"):
        hashes = hashes | {best["source_hash"]}
    missing = sorted(hashes - set(_column(db, "select hash from sources")))
    if missing:
        return f"no code of {len(missing)} attempt(s) in progress or recorded, e.g. {missing[0]}"
    return None


def _column(db: sqlite3.Connection, sql: str, args: list | None = None) -> list:
    """The first column of a query; empty when the table does not exist (an emptied store)."""
    try:
        return [r[0] for r in db.execute(sql, args or [])]
    except sqlite3.OperationalError as e:
        if "no such table" in str(e):
            return []
        raise
