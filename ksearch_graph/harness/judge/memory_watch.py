"""A memory limit for a process that cannot take an address-space limit (CUDA maps far more virtual memory than it
uses): a thread reads the process's resident memory every ``interval_s`` and calls ``on_exceed(rss)`` once when it
passes ``limit_bytes``. The judge's: its own inputs and references grew it to 24 GB on a 6 GiB KernelBench input."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable


def rss_bytes(pid: int | str = "self") -> int:
    """Resident memory of a process (0 where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class MemoryWatch:
    """``with MemoryWatch(limit, on_exceed): ...``: watches this process (or ``pid``) while the block runs."""

    def __init__(self, limit_bytes: int, on_exceed: Callable[[int], None], pid: int | str = "self",
                 interval_s: float = 0.1):
        self.limit, self.on_exceed, self.pid, self.interval_s = limit_bytes, on_exceed, pid, interval_s
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="ksearch-memory-watch", daemon=True)
        self.peak = 0

    def _watch(self) -> None:
        while not self.stopped.wait(self.interval_s):
            rss = rss_bytes(self.pid)
            self.peak = max(self.peak, rss)
            if rss > self.limit:
                self.stopped.set()
                self.on_exceed(rss)

    def __enter__(self) -> MemoryWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.thread.join(timeout=1.0)
