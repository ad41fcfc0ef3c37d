"""The candidate's process seen from the judge: started in its sandbox and its own cgroup, requests with time limits,
every answer parsed strictly (wire.parse), its host memory watched, and what its death means."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

from ksearch_graph.harness.job import RUNNER_DIED, STARTING_RUNNER
from ksearch_graph.harness.judge.cgroup import CpuAccount, CpuGroup, ProcessTree
from ksearch_graph.harness.judge.sandbox import CACHE, Sandbox
from ksearch_graph.harness.reporting import PROGRESS, Failure
from ksearch_graph.harness.wire import Channel, Error, Exit, Malformed, pair, parse

HARNESS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class RunnerProcess:
    """The candidate's process: ``request`` sends a message (with the descriptors it lends) and returns the checked
    answer; ``account`` reads its whole tree's CPU time (cgroup.py)."""

    def __init__(self, cfg: dict, log_path: str, env: dict, memory_limit_gb: float, sandbox: Sandbox,
                 cache_dir: str):
        self.memory_limit = int(memory_limit_gb * 2**30)
        self.log_path, self.sandbox = log_path, sandbox
        self.account = CpuAccount(CpuGroup.make())
        ours, theirs = pair()
        cfg = cfg | {"sandboxed": sandbox.kind is not None, "cache": CACHE if sandbox.kind else cache_dir}
        argv = [sys.executable, os.path.join(HARNESS_DIR, "candidate", "runner.py"), "--fd", str(theirs.fileno()),
                "--config", json.dumps(cfg)]
        cmd, inner_env = sandbox.command(argv, candidate=cfg["candidate"], cache=cache_dir, env=env,
                                         extra_env={"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
                                                    "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
        popen_env = inner_env if sandbox.kind is None else {"PATH": env.get("PATH", "/usr/bin:/bin")}
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(self.account.join_command(cmd), pass_fds=[theirs.fileno()],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=cfg["candidate"],
                                         env=popen_env)
        theirs.close()
        self.account.attach(self.proc.pid)
        self.channel = Channel(ours)
        self.phase = STARTING_RUNNER  # a death before its "loaded" is never the candidate's doing

    def request(self, msg: tuple | None, timeout_s: float, phase: str, expect: type | tuple = object,
                fds: tuple[int, ...] = (), spin_s: float = 0.0) -> tuple:
        """Send ``msg`` (None: only wait) and return the answer, one of the ``expect`` types; an Error answer raises
        its Failure, anything else (another type, a message off the schema) makes the candidate suspicious.
        ``spin_s``: poll for the answer without sleeping this long first (a timed call's, on a GPU)."""
        self.phase = phase
        expect = expect if isinstance(expect, tuple) else (expect,)
        try:
            if msg is not None:
                self.channel.send(msg, fds)
            if not (spin_s and self.channel.spin(min(spin_s, timeout_s))) and not self.wait(timeout_s):
                self.kill()
                raise Failure("timeout", f"the candidate did not finish {phase} within {timeout_s:g} s")
            data = self.channel.receive_untrusted()
            reply = parse(data, expect)
        except (EOFError, OSError):
            raise self.died() from None
        except Malformed as e:
            self.kill()
            raise Failure("suspicious", f"{phase}: the candidate's process sent what the protocol does not allow "
                          f"({e})") from None
        if isinstance(reply, Error):
            raise Failure(reply.status, f"{phase}:\n{reply.message}" if phase else reply.message)
        return reply

    def wait(self, timeout_s: float) -> bool:
        """Wait for an answer, watching the candidate's host memory (an address-space limit would break CUDA)."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.channel.poll(min(0.1, max(0.0, deadline - time.monotonic()))):
                return True
            rss = self.rss_bytes()
            if rss > self.memory_limit:
                self.kill()
                raise Failure("runtime_error", f"the candidate's process used {rss / 2**30:.1f} GB of host memory "
                              f"during {self.phase}; the limit is {self.memory_limit / 2**30:g} GB")
            if self.proc.poll() is not None and not self.channel.poll(0):
                raise EOFError
            if time.monotonic() >= deadline:
                return False

    def rss_bytes(self) -> int:
        """Resident memory of the whole tree (the sandbox's processes included)."""
        total = 0
        for pid in ProcessTree(self.proc.pid).pids():
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"/proc/{pid}/statm") as f:
                    total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        return total

    def send(self, msg: tuple, fds: tuple[int, ...] = ()) -> None:
        try:
            self.channel.send(msg, fds)
        except OSError:
            raise self.died() from None

    def died(self) -> Failure:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.returncode
        how = f"exited with code {code}"
        # A signal: the process's own (no sandbox), or its child's that bubblewrap reports as 128 + the signal.
        number = -code if code is not None and code < 0 else code - 128 if (
            code is not None and code > 128 and self.sandbox.kind) else None
        with contextlib.suppress(ValueError):
            if number:
                sig = signal.Signals(number)
                how = f"was killed by {sig.name} ({signal.strsignal(sig)})"
        return Failure("runtime_error", f"{RUNNER_DIED}{how} during {self.phase}\n{self.log_tail()}")

    def log_tail(self, limit: int = 1500) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                text = f.read()
        except OSError:
            return ""
        lines = [line for line in text.splitlines()
                 if not line.startswith((PROGRESS, "Extension modules:")) and HARNESS_DIR not in line]
        return "\n".join(lines)[-limit:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.account.close()

    def stop(self) -> None:
        with contextlib.suppress(OSError, Failure):
            self.channel.send(Exit())
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.kill()
        self.channel.close()
