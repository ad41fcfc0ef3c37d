"""The guards against forged timing in the candidate's process, armed together as the last step before the candidate
is imported: integrity.py's snapshot of the harness's own objects (checked before every timed call and with every
report) and audit.py's hook (blocks the searches that would find them). Their findings travel to the judge as two
flags, ``harness_changed`` and ``introspection`` (protocol.Flags); docs/harness.md's "Forged timing" says what each
catches and what it does not.
"""

from __future__ import annotations

import math
import os
import sys
import time

from ksearch_graph.harness.candidate import audit, integrity
from ksearch_graph.harness.reporting import clip
from ksearch_graph.harness.wire import Error

# The whole harness (its three processes' sub-packages and what they share), not only this sub-package: a
# candidate that changes the wire or the timer is changing the harness as much as one that changes this module.
HARNESS_PACKAGE = __package__.rsplit(".", 1)[0]
HARNESS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FLAGS = {"harness_changed": "the candidate changed the harness's own objects in its process",
         "introspection": "the candidate reached for the harness's own objects"}


def harness_modules() -> dict:
    """{label: module}: every module of this package the process has loaded, and the process's main module where it
    is one of them (runner.py, judge.py: started by path)."""
    package = HARNESS_PACKAGE
    modules = {name: m for name, m in sys.modules.items() if name.startswith(package + ".") and m is not None}
    main = sys.modules.get("__main__")
    if (getattr(main, "__package__", None) or "").startswith(package + "."):
        modules[f"{main.__package__} (__main__)"] = main
    return modules


def snapshot(modules: dict, objects: dict) -> integrity.Integrity:
    """integrity.py's snapshot of ``modules`` ({label: module}) and ``objects`` ({label: (instance, names the harness
    changes itself)})."""
    check = integrity.Integrity()
    integrity.watch_all(check, modules, objects)
    return check


class Guards:
    """The armed guards of one candidate's process: ``flags()`` for every report, ``error()`` for a failure that may
    come from a blocked reach (audit.py raises into the candidate's code)."""

    def __init__(self, guard: integrity.Guard, audit_log: audit.Audit):
        self.integrity, self.audit = guard, audit_log

    def flags(self) -> dict:
        """protocol.Flags' two fields: what each guard found so far, or None."""
        return {"harness_changed": self.integrity.flag() or None, "introspection": self.audit.flag() or None}

    def check_us(self, tries: int = 3) -> float:
        """What the integrity check costs per timed call (the shortest of ``tries``, in us)."""
        best = math.inf
        for _ in range(tries):
            t0 = time.perf_counter()
            self.integrity.check()
            best = min(best, (time.perf_counter() - t0) * 1e6)
        return best

    def watch(self, label: str, instance, mutable: tuple[str, ...] = ()) -> None:
        """One more of the harness's objects, made after ``arm`` (the runner)."""
        self.integrity.integrity.watch(label, instance, mutable)

    def error(self) -> Error | None:
        found = self.flags()
        if not any(found.values()):
            return None
        named = "; ".join(f"{FLAGS[name]} ({', '.join(map(str, items))})" for name, items in found.items() if items)
        return Error("suspicious", clip(named, 600))


def arm(candidate_root: str, timer, objects: dict) -> Guards:
    """Snapshot the harness's modules, ``timer`` (whose ``guard`` then runs before each of its timed calls) and
    ``objects`` ({label: (instance, names the harness changes itself)}), and install the audit hook: the last step
    before candidate code first runs."""
    modules = harness_modules()
    guard = integrity.Guard(integrity.Integrity())
    timer.guard = guard.check  # before the snapshot: replacing it is a change too
    files = [m.__file__ for m in modules.values() if getattr(m, "__file__", None)
             and os.path.abspath(m.__file__).startswith(HARNESS_DIR + os.sep)]
    guards = Guards(guard, audit.install(files, candidate_root))  # armed now: the snapshot watches its record too
    objects = {"the timer": (timer, type(timer).STATE), **objects, "the guards": (guards, ()),
               "the integrity check's guard": (guard, ("found",)), "the audit hook's record": (guards.audit, ())}
    integrity.watch_all(guard.integrity, modules, objects)
    return guards
