"""The candidate's process seen from the judge: requests with time limits, its host memory, and what its death means."""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import time

from .protocol import Error, Exit, TensorsOnly
from .reporting import PROGRESS, Failure

HERE = os.path.dirname(os.path.abspath(__file__))


class RunnerProcess:
    """The candidate's process, seen from the judge: requests with time limits, and what its death means."""

    def __init__(self, cfg: dict, log_path: str, env: dict, memory_limit_gb: float):
        from multiprocessing.connection import Connection

        self.memory_limit = int(memory_limit_gb * 2**30)
        ours, theirs = socket.socketpair()
        self.log_path = log_path
        cmd = [sys.executable, os.path.join(HERE, "runner.py"), "--fd", str(theirs.fileno()),
               "--config", json.dumps(cfg)]
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=log, cwd=cfg["candidate"], env=env)
        theirs.close()
        self.conn = Connection(ours.detach())
        self.phase = "start-up"

    def request(self, msg: tuple | None, timeout_s: float, phase: str, expect: type | tuple = object) -> tuple:
        """Send ``msg`` (None: only wait) and return the reply, one of the ``expect`` types; an Error reply raises its
        Failure, any other reply (or a message that is not one) makes the candidate suspicious."""
        self.phase = phase
        try:
            if msg is not None:
                self.conn.send(msg)
            if not self.wait(timeout_s):
                self.kill()
                raise Failure("timeout", f"the candidate did not finish {phase} within {timeout_s:g} s")
            data = self.conn.recv_bytes()
        except (EOFError, OSError):
            raise self.died() from None
        try:
            reply = TensorsOnly(io.BytesIO(data)).load()
        except pickle.UnpicklingError as e:
            self.kill()
            raise Failure("suspicious", f"{phase}: {e}") from None
        except Exception as e:  # noqa: BLE001 - a reply type with the wrong fields, a truncated stream: not ours
            self.kill()
            raise Failure("suspicious", f"{phase}: the candidate's process sent a malformed message "
                          f"({type(e).__name__})") from None
        if isinstance(reply, Error):
            raise Failure(str(reply.status), f"{phase}:\n{reply.message}" if phase else str(reply.message))
        if not isinstance(reply, expect):
            self.kill()
            raise Failure("suspicious", f"{phase}: the candidate's process answered {type(reply).__name__[:40]}, not "
                          f"{' or '.join(k.__name__ for k in (expect if isinstance(expect, tuple) else (expect,)))}")
        return reply

    def wait(self, timeout_s: float) -> bool:
        """Wait for an answer, watching the candidate's host memory (an address-space limit would break CUDA)."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.conn.poll(min(0.1, max(0.0, deadline - time.monotonic()))):
                return True
            rss = self.rss_bytes()
            if rss > self.memory_limit:
                self.kill()
                raise Failure("runtime_error", f"the candidate's process used {rss / 2**30:.1f} GB of host memory "
                              f"during {self.phase}; the limit is {self.memory_limit / 2**30:g} GB")
            if time.monotonic() >= deadline:
                return False

    def rss_bytes(self) -> int:
        try:
            with open(f"/proc/{self.proc.pid}/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return 0

    def send(self, msg: tuple) -> None:
        try:
            self.conn.send(msg)
        except OSError:
            raise self.died() from None

    def died(self) -> Failure:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.returncode
        if code is not None and code < 0:
            sig = signal.Signals(-code)
            how = f"was killed by {sig.name} ({signal.strsignal(sig)})"
        else:
            how = f"exited with code {code}"
        return Failure("runtime_error", f"the candidate's process {how} during {self.phase}\n{self.log_tail()}")

    def log_tail(self, limit: int = 1500) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                text = f.read()
        except OSError:
            return ""
        lines = [line for line in text.splitlines()
                 if not line.startswith((PROGRESS, "Extension modules:")) and HERE not in line]
        return "\n".join(lines)[-limit:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        with contextlib.suppress(OSError, Failure):
            self.conn.send(Exit())
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()

