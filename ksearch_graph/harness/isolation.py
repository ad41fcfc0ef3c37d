"""Keeping the candidate's process apart: its own network namespace, death with its parent, no readable judge
memory, and no orphan left running."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys


def isolate_network() -> str:
    """Enter new user + network namespaces: only a loopback interface, which is down. Needs a single thread."""
    if not sys.platform.startswith("linux"):
        return "no (not Linux)"
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(0x10000000 | 0x40000000) != 0:  # CLONE_NEWUSER | CLONE_NEWNET
        return f"no (unshare: {os.strerror(ctypes.get_errno())})"
    try:  # keep our own uid/gid inside, so files keep their owners
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    except OSError:
        pass
    return "yes"


def isolate_judge_network() -> str:
    """The judge's own network namespace (it never needs one): a new one alone as root, which keeps the root's
    rights over cgroups; with a user namespace otherwise. Needs a single thread: the first thing the judge does."""
    if not sys.platform.startswith("linux"):
        return "no (not Linux)"
    libc = ctypes.CDLL(None, use_errno=True)
    if os.geteuid() == 0 and libc.unshare(0x40000000) == 0:  # CLONE_NEWNET
        return "yes"
    return isolate_network()


def die_with_parent(parent: int) -> None:
    """SIGKILL when ``parent`` dies (Linux), and exit now if it already has: no GPU kept busy for nobody."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
        except (OSError, AttributeError):
            pass
        if os.getppid() != parent:
            os._exit(1)


def harden() -> None:
    """Linux process flags, set before anything else runs.

    Not dumpable: other processes of our user (the candidate's) cannot read our memory, environment or file
    descriptors through /proc. Child subreaper: whatever the candidate starts and orphans (a double fork, a new
    session) is re-parented to us instead of init, so ``kill_descendants`` finds and kills it.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.prctl(4, 0)  # PR_SET_DUMPABLE
        libc.prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass



def kill_descendants() -> None:
    """SIGKILL every child we have, including the candidate's orphans re-parented to us (see harden), until none is
    left: the next generation is re-parented to us when its parent dies."""
    me = str(os.getpid())
    for _ in range(50):
        children = []
        for stat in os.listdir("/proc"):
            if not stat.isdigit():
                continue
            try:
                with open(f"/proc/{stat}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == me:
                children.append(int(stat))
        if not children:
            return
        for pid in children:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for pid in children:
            with contextlib.suppress(OSError):
                os.waitpid(pid, 0)

