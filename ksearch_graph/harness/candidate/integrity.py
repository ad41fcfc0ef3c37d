"""The harness's own objects in the candidate's process, as they were before the candidate was imported.

What times a call lives in the candidate's process: the timer instance, the functions it bound, the harness's modules
and classes (timer.py, timing.py, runner.py, protocol.py, policy.py ...), the connection that carries the timings to
the judge. A candidate that reaches them (audit.py blocks the
generic searches, but not a walk up from its own frame through ``f_back``) could replace what they call. ``changed()``
names every difference from the snapshot: a module global, class attribute or watched instance attribute rebound or
deleted; a watched function's code object swapped, its bytecode or constants edited in place (ctypes), its defaults,
globals or closure cells changed; the same for the functions those cells hold (two levels). A name added to a watched
namespace counts too (it could hide a base class's method, or a builtin the module's functions call). Values are
compared by identity: an object's ``__eq__`` is not ours to call.

Not covered: state a watched object holds inside a container (a list's items), changes undone before the next check
(the timer binds what it calls before each call, so such a change lasts into a check or times nothing), and writes
from C or ctypes to anything but code (docs/threat-model.md).
"""

from __future__ import annotations

import operator
import types

CELL_DEPTH = 2  # functions held in closure cells, and theirs, are watched too


def _cells(fn) -> tuple:
    out = []
    for cell in fn.__closure__ or ():
        try:
            out.append(cell.cell_contents)
        except ValueError:  # an empty cell
            out.append(None)
    return tuple(out)


def _function_state(value, depth: int = CELL_DEPTH) -> tuple | None:
    """What a Python function runs, which can change while the function stays the same object, as (objects compared
    by identity, bytecode hashes): its code object, bytecode, constants, names, defaults, globals and closure cells,
    and those of the functions its cells hold; for a bound method or a classmethod/staticmethod, its function's (and a
    bound method's receiver). None for anything else."""
    receiver = (value.__self__,) if isinstance(value, types.MethodType) else ()
    fn = getattr(value, "__func__", value)
    if not isinstance(fn, types.FunctionType):
        return (receiver, ()) if receiver else None
    code, cells = fn.__code__, _cells(fn)
    objects = [*receiver, code, code.co_consts, code.co_names, fn.__defaults__, fn.__kwdefaults__, fn.__globals__,
               *cells]
    hashes = [hash(code.co_code)]
    for cell in cells if depth > 0 else ():
        inner = _function_state(cell, depth - 1)
        if inner is not None:
            objects += inner[0]
            hashes += inner[1]
    return tuple(objects), tuple(hashes)


def _same(a: tuple | None, b: tuple | None) -> bool:
    if a is None or b is None:
        return a is b
    return len(a[0]) == len(b[0]) and all(map(operator.is_, a[0], b[0])) and a[1] == b[1]


class Integrity:
    """A snapshot of namespaces (modules, classes, instances), compared by ``changed()``."""

    def __init__(self):
        # (label, live namespace dict, {name: (value, function state)}, names that may change)
        self.kept: list[tuple[str, dict, dict, frozenset]] = []
        self.types: list[tuple[str, object, type]] = []

    def watch(self, label: str, space, mutable: tuple[str, ...] = ()) -> None:
        """Watch ``space``'s namespace (a module, a class: its own dict; an instance: its ``__dict__``); names in
        ``mutable`` are state the harness changes itself."""
        namespace = vars(space)
        if isinstance(space, type):  # copyreg caches a class's slot names there at the first pickle of an instance
            mutable = (*mutable, "__slotnames__")
        self.kept.append((label, namespace, {k: (v, _function_state(v)) for k, v in namespace.items()
                                             if k not in mutable}, frozenset(mutable)))
        self.types.append((label, space, type(space)))

    def watch_module(self, label: str, module: types.ModuleType) -> None:
        """A module and every class it defines. Its ``__warningregistry__`` is left out: ``warnings.warn`` adds it to
        the module a warning is attributed to (an honest library's ``stacklevel`` can point at the harness's frame),
        and only the warnings machinery reads it."""
        self.watch(label, module, ("__warningregistry__",))
        for name, value in vars(module).items():
            if isinstance(value, type) and value.__module__ == module.__name__:
                self.watch(f"{label}.{name}", value)

    def changed(self) -> list[str]:
        out = [f"{label} (its type)" for label, space, kind in self.types if type(space) is not kind]
        for label, now, before, mutable in self.kept:
            for name, (value, state) in before.items():
                if name not in now:
                    out.append(f"{label}.{name} (deleted)")
                elif now[name] is not value:
                    out.append(f"{label}.{name}")
                elif state is not None and not _same(_function_state(value), state):
                    out.append(f"{label}.{name} (its code, defaults, globals or closure)")
            out += [f"{label}.{name} (added)" for name in now.keys() - before.keys() - mutable]
        return out


class Guard:
    """The runner's integrity check: ``check()`` before each timed call and ``flag()`` for each report. What it
    found once stays found (a change undone later was still made)."""

    def __init__(self, integrity: Integrity):
        self.integrity = integrity
        self.found: list[str] = []

    def check(self) -> None:
        for what in self.integrity.changed():
            if what not in self.found:
                self.found.append(what)

    def flag(self) -> list[str]:
        self.check()
        return list(self.found)


def watch_all(integrity: Integrity, modules: dict, objects: dict) -> None:
    """Watch the runner's ``modules`` ({label: module}: each with the classes it defines) and ``objects`` ({label:
    (instance, names the harness changes itself)}; None and plain functions skipped: a function is watched where it
    is held)."""
    for label, module in modules.items():
        if module is not None:
            integrity.watch_module(label, module)
    for label, (instance, mutable) in objects.items():
        if instance is not None and hasattr(instance, "__dict__") and not isinstance(instance, types.FunctionType):
            integrity.watch(label, instance, mutable)
