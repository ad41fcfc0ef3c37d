"""One writer per run directory: an exclusive OS lock on ``DIR/writer.lock``.

``fcntl.flock`` belongs to the open file: the kernel drops it when the holder exits in any way (kill -9
included), so a lock is never stale. The file also names its holder (pid, host, since, command) for the
error a second writer gets. Readers (show, history, report, export) never take it.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

LOCK_FILE = "writer.lock"


class RunLocked(Exception):
    """Another process is writing to this run directory."""


class RunLock:
    def __init__(self, run_path: str | Path):
        self.path = Path(run_path) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # OSError on a read-only dir: the CLI words it
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise RunLocked(f"{self.path.parent} is being written by another process ({holder}); "
                            "wait for it to finish or stop it (Ctrl-C); `ksearch show` works meanwhile") from None
        self._fd = fd
        _write_holder(fd)
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the file drops the lock
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _write_holder(fd: int) -> None:
    info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join([_program(), *sys.argv[1:]])[:200]}
    data = json.dumps(info).encode()
    try:  # written before the old one is cut off: a full disk leaves the old description as it was
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    except OSError:
        pass  # a full disk: the lock holds anyway, only the holder's description is not this process's


def _program() -> str:
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    return "ksearch" if "ksearch" in (sys.argv[0] if sys.argv else "") else name


def _read_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"pid {info['pid']} on {info['host']}, since {info['since']}: {info.get('command', '?')}"
    except (OSError, ValueError, KeyError):
        return "holder unknown"



def writer_active(run_path: str | Path) -> bool:
    """Whether a process holds the run's writer lock now, seen in /proc/locks without touching the lock (trying it
    could make a writer starting that moment find it taken). True where that cannot be told (not Linux)."""
    path = Path(run_path) / LOCK_FILE
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    try:
        with open("/proc/locks") as f:
            table = f.read()
    except OSError:
        return True
    wanted = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    for line in table.splitlines():
        fields = line.split()
        if "FLOCK" not in fields:
            continue
        for field in fields:
            parts = field.split(":")
            if len(parts) == 3:
                try:
                    if (int(parts[0], 16), int(parts[1], 16), int(parts[2])) == wanted:
                        return True
                except ValueError:
                    pass
    return False
