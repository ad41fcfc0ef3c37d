"""Read a run's SQLite files without creating or changing anything beside them.

SQLite's own read-only mode (``mode=ro``) still creates a ``-wal`` and a ``-shm`` file next to a WAL database, and
fails where they cannot be made (a full disk, a read-only directory). Readers (``ksearch show``, ``history``,
``report``, ``export``) use ``open_read_only`` instead:

- while its writer runs (``live``) and its ``-wal`` and ``-shm`` files exist, ``mode=ro`` reads through them: they
  exist already, so nothing is created, and the writer's locks keep the reads consistent;
- otherwise nobody writes it: the main file is read into memory and the committed frames of its ``-wal`` file
  (checked by salt and checksum, as SQLite checks them) are applied there, so a run stopped by ``kill -9`` or
  Ctrl-C reads exactly as SQLite would read it, and not one byte beside it changes.
"""

from __future__ import annotations

import sqlite3
import struct
from pathlib import Path

HEADER = b"SQLite format 3\x00"
WAL_HEADER = 32
FRAME_HEADER = 24
_MAGIC = (0x377F0682, 0x377F0683)  # checksums in little- / big-endian words


class NoDatabase(Exception):
    """The file is missing or empty: there is nothing to read."""


def open_read_only(path: Path, *, live: bool = False) -> sqlite3.Connection:
    """A connection that only reads ``path`` (with its committed WAL frames); NoDatabase if missing or empty.
    ``live``: a writer has it open now."""
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        raise NoDatabase(str(path))
    if live and _sibling(path, "-shm").exists() and _sibling(path, "-wal").exists():
        try:
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False, timeout=30)
            db.execute("select count(*) from sqlite_master").fetchone()
            return db
        except sqlite3.OperationalError:
            pass  # an index it cannot use (a full disk, a stale index): read the files themselves
    return snapshot(path)


def snapshot(path: Path) -> sqlite3.Connection:
    """The database as SQLite would read it, built in memory from the main file and its WAL's committed frames."""
    path = Path(path)
    image = bytearray(path.read_bytes())
    if not image.startswith(HEADER):  # as SQLite: a main file that is no database is not read, whatever its WAL holds
        raise sqlite3.DatabaseError("file is not a database")
    wal = _sibling(path, "-wal")
    frames = committed_frames(wal.read_bytes()) if wal.exists() else None
    if frames is not None:
        page_size, pages, db_pages = frames
        for number, page in pages.items():
            start = (number - 1) * page_size
            if len(image) < start + page_size:
                image.extend(bytes(start + page_size - len(image)))
            image[start:start + page_size] = page
        del image[db_pages * page_size:]
    if len(image) >= 20:
        image[18] = image[19] = 1  # the rollback-journal format: an image in memory has no WAL of its own
    db = sqlite3.connect(":memory:", check_same_thread=False)
    db.deserialize(bytes(image))
    return db


def committed_frames(wal: bytes) -> tuple[int, dict[int, bytes], int] | None:
    """(page size, {page number: its latest committed content}, database size in pages after the last commit), or
    None when the WAL holds no valid commit. Frames count from the header on while salts and checksums hold."""
    if len(wal) < WAL_HEADER:
        return None
    magic, _version, page_size, _seq, salt1, salt2, c1, c2 = struct.unpack(">8I", wal[:WAL_HEADER])
    if magic not in _MAGIC or page_size < 512 or page_size & (page_size - 1):
        return None
    order = ">" if magic & 1 else "<"
    sums = _checksum(wal[:24], (0, 0), order)
    if sums != (c1, c2):
        return None
    pages: dict[int, bytes] = {}
    pending: dict[int, bytes] = {}
    db_pages = None
    at = WAL_HEADER
    while at + FRAME_HEADER + page_size <= len(wal):
        number, commit, s1, s2, f1, f2 = struct.unpack(">6I", wal[at:at + FRAME_HEADER])
        page = wal[at + FRAME_HEADER:at + FRAME_HEADER + page_size]
        if (s1, s2) != (salt1, salt2):
            break
        sums = _checksum(page, _checksum(wal[at:at + 8], sums, order), order)
        if sums != (f1, f2):
            break
        pending[number] = page
        if commit:  # a commit frame: everything up to here is part of the database
            pages.update(pending)
            pending = {}
            db_pages = commit
        at += FRAME_HEADER + page_size
    return None if db_pages is None else (page_size, pages, db_pages)


def _checksum(data: bytes, sums: tuple[int, int], order: str) -> tuple[int, int]:
    s0, s1 = sums
    words = struct.unpack(f"{order}{len(data) // 4}I", data)
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[i + 1] + s0) & 0xFFFFFFFF
    return s0, s1


def _sibling(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)
