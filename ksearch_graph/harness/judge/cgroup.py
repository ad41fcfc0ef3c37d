"""The CPU time of the candidate's whole process tree, as the judge reads it, and the end of that tree.

Where the host lets us make a cgroup v2 group (root, or a delegated subtree), the candidate's sandbox starts inside
one of its own: its ``cpu.stat`` counts every thread of every process it ever ran, exited ones included, in
microseconds, and ``cgroup.kill`` ends them all. Elsewhere the judge sums the CPU time of the live threads of the tree
it can see in /proc (``ProcessTree``): a thread or process that exits before the reading escapes it (the result says
which accounting ran). Either way the figure comes from the kernel, never from the candidate's process.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time


def _cgroup2_mount() -> str | None:
    """Where the unified (v2) hierarchy is mounted: /sys/fs/cgroup, or /sys/fs/cgroup/unified on a hybrid host."""
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                if right.split()[:1] == ["cgroup2"]:
                    return left.split()[4]
    except OSError:
        pass
    return None


def _own_group() -> str:
    """This process's v2 group path ("0::/path" in /proc/self/cgroup)."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        pass
    return "/"


class CpuGroup:
    """A cgroup v2 group for one candidate's sandbox: ``procs`` is the file a process writes its pid into to join
    (before it starts the sandbox: everything it forks stays inside), ``cpu_us()`` the group's CPU time so far."""

    def __init__(self, path: str):
        self.path = path
        self.procs = os.path.join(path, "cgroup.procs")
        self._stat = os.open(os.path.join(path, "cpu.stat"), os.O_RDONLY)

    @classmethod
    def make(cls) -> CpuGroup | None:
        """A new group beside (below) this process's own, or None where the host does not let us make one."""
        mount = _cgroup2_mount()
        if mount is None:
            return None
        parent = os.path.join(mount, _own_group().lstrip("/"))
        path = os.path.join(parent, f"ksearch-candidate-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            os.mkdir(path)
            group = cls(path)
            with open(group.procs, "a"):  # joining must be allowed too (write access to cgroup.procs)
                pass
            return group
        except OSError:
            with contextlib.suppress(OSError):
                os.rmdir(path)
            return None

    def cpu_us(self) -> float:
        data = os.pread(self._stat, 4096, 0).decode()
        for line in data.splitlines():
            if line.startswith("usage_usec "):
                return float(line.split()[1])
        return 0.0

    def kill(self) -> None:
        """SIGKILL every process in the group (cgroup.kill, Linux 5.14 on), then remove it once empty."""
        with contextlib.suppress(OSError):
            with open(os.path.join(self.path, "cgroup.kill"), "w") as f:
                f.write("1")
        for _ in range(100):  # the group can only go once its processes are gone
            try:
                os.rmdir(self.path)
                break
            except OSError:
                time.sleep(0.01)
        if self._stat >= 0:  # once: a second close would close whatever file took the number since
            with contextlib.suppress(OSError):
                os.close(self._stat)
            self._stat = -1


class ProcessTree:
    """Without a cgroup: the CPU time of the live threads of ``root`` and its descendants (/proc's schedstat, ns)."""

    def __init__(self, root: int):
        self.root = root

    def pids(self) -> list[int]:
        found, todo = [], [self.root]
        while todo:
            pid = todo.pop()
            found.append(pid)
            with contextlib.suppress(OSError):
                for tid in os.listdir(f"/proc/{pid}/task"):
                    with open(f"/proc/{pid}/task/{tid}/children") as f:
                        todo += [int(c) for c in f.read().split()]
        return found

    def cpu_us(self) -> float:
        total = 0
        for pid in self.pids():
            with contextlib.suppress(OSError, ValueError, IndexError):
                for tid in os.listdir(f"/proc/{pid}/task"):
                    with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                        total += int(f.read().split()[0])
        return total / 1e3


class CpuAccount:
    """The candidate's CPU time as the judge reads it: through its cgroup where there is one (``group``), else
    through /proc from the root of its tree (``attach``)."""

    def __init__(self, group: CpuGroup | None):
        self.group = group
        self.tree: ProcessTree | None = None

    @property
    def kind(self) -> str:
        return "cgroup v2 (every process and thread)" if self.group else "/proc (live threads only)"

    def attach(self, root_pid: int) -> None:
        self.tree = ProcessTree(root_pid)

    def cpu_us(self) -> float:
        if self.group is not None:
            return self.group.cpu_us()
        return self.tree.cpu_us() if self.tree is not None else 0.0

    def join_command(self, argv: list[str]) -> list[str]:
        """``argv`` started inside the group: a shell joins it, then becomes ``argv`` (exec)."""
        if self.group is None:
            return argv
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', self.group.procs, *argv]

    def close(self) -> None:
        if self.group is not None:
            self.group.kill()
