"""Introspection that reaches the harness, blocked in the candidate's process (a PEP 578 audit hook).

A candidate that finds the harness's timer (the object holding ``torch.cuda.Event.elapsed_time`` or
``time.perf_counter``) can replace what it reads and report any time it likes. The generic ways to find an object one
holds no reference to raise audit events in CPython 3.8-3.12, and an audit hook cannot be removed once installed:

- every object the collector tracks, and what refers to an object: ``gc.get_objects``, ``gc.get_referrers``,
  ``gc.get_referents``; every thread's frame: ``sys._current_frames``, ``sys._current_exceptions``;
- a frame of the harness: ``sys._getframe(n)`` returning one, a traceback's ``tb_frame``, a generator's
  ``gi_frame`` (also ``cr_frame``, ``ag_frame``);
- the harness's code changed in place or cloned: ``__code__``, ``__defaults__`` or ``__kwdefaults__`` set on a harness
  function (or a harness code object put into another), code or a function made from harness code, source compiled
  under a harness file's name (which would pass for harness frames here);
- code run inside the harness's frames: ``sys.settrace``, ``sys.setprofile`` (also set from C, for all threads, or
  through ``threading``: each raises the same event), ``sys.monitoring.register_callback``; a trace function's changes to ``f_locals`` are written back
  into the frame, so one set on the timer's frame through ``f_back`` could rewrite the call's clock reads;
- memory written through ctypes: the Python C API (``ctypes.pythonapi``: ``PyFrame_LocalsToFast``, ``Py_IncRef``,
  ...), ``from_address`` (a writable view). ``string_at`` only reads (any object's address is its ``id`` anyway): a
  kernel that crashes through it (tests/cheats/segfault.py) is a crash, not a forgery.

Such an event is blocked (the hook raises, so nothing is returned) and recorded, when code other than the harness
caused it: walking up from the code that raised the event, a frame of the candidate's (or of code with no file) is met
before a frame of the harness. Honest kernels (torch, Triton's JIT and interpreter, CuPy, torch extensions) raise none
of these in normal use (docs/threat-model.md). Not covered: ``frame.f_back``, ``f_locals`` and ``f_globals`` raise no
event, so a candidate can still walk up from its own frame (integrity.py catches what it changes there), and
``ctypes.cast`` of an address to a pointer reads and writes memory without one.
"""

from __future__ import annotations

import os
import sys

# Events with no honest use in a kernel: always the candidate's reach for objects it was not given.
SEARCHES = frozenset({"gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames",
                      "sys._current_exceptions"})
FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
CODE_ATTRIBUTES = frozenset({"__code__", "__defaults__", "__kwdefaults__"})
MEMORY = frozenset({"ctypes.cdata"})
# A trace or profile function runs inside the harness's frames and CPython writes its f_locals back into them (and a
# monitoring callback is called from them): the clock reads of the call under way could be rewritten.
# Also raised by PyEval_SetProfile/SetTrace from C, and in each thread for threading's and the all-threads forms.
FRAME_HOOKS = frozenset({"sys.settrace", "sys.setprofile", "sys.monitoring.register_callback"})
MAX_FOUND = 20  # what is kept for the flag; the first ones say enough


class Blocked(RuntimeError):
    """Raised into the candidate's code where an audit event would have reached the harness."""


class Audit:
    """The hook's record, read by the runner for its flags. ``found`` is appended to by the hook only."""

    def __init__(self, found: list):
        self.found = found

    def flag(self) -> list[str]:
        return list(self.found)


def install(harness_files: list[str], candidate_root: str) -> Audit:
    """Install the hook (once per process) and arm it: from now on, events caused by code other than the harness's
    ``harness_files`` are checked. Call it right before the candidate is imported; what the harness did before (torch,
    the task's modules) is not judged."""
    harness = frozenset(os.path.realpath(f) for f in harness_files)
    root = os.path.realpath(candidate_root) + os.sep
    found: list[str] = []
    inside: set[int] = set()  # threads now running the hook (its own attribute reads raise events too)
    get_ident = __import__("_thread").get_ident
    getframe, realpath, isinstance_ = sys._getframe, os.path.realpath, isinstance
    code_type, function_type = type(install.__code__), type(install)
    paths: dict[str, str] = {}  # co_filename -> realpath, cached

    def resolved(filename: str) -> str:
        path = paths.get(filename)
        if path is None:
            path = paths[filename] = realpath(filename) if not filename.startswith("<") else filename
        return path

    def is_harness_file(filename) -> bool:
        return isinstance_(filename, str) and resolved(filename) in harness

    def is_harness_code(code) -> bool:
        return isinstance_(code, code_type) and is_harness_file(code.co_filename)

    def candidate_caused(frame) -> bool:
        """Walking up from ``frame``: a frame of the candidate's or of code with no file before one of the
        harness's (a thread of the candidate's started on a library function meets neither: the candidate's)."""
        while frame is not None:
            path = resolved(frame.f_code.co_filename)
            if path in harness:
                return False
            if path.startswith(root) or path.startswith("<") and not path.startswith("<frozen"):
                return True
            frame = frame.f_back
        return True

    def harness_frame(frame) -> bool:
        return frame is not None and is_harness_code(frame.f_code)

    def reaches(event: str, args: tuple) -> str | None:
        """What the event would reach, or None."""
        if event in SEARCHES:
            return event
        if event in FRAME_HOOKS:
            return f"the harness's frames through a trace, profile or monitoring function ({event})"
        if event == "sys._getframe":
            return "a frame of the harness (sys._getframe)" if args and harness_frame(args[0]) else None
        if event == "object.__getattr__":
            obj, name = args
            if name in FRAME_ATTRIBUTES and harness_frame(getattr(obj, name, None)):
                return f"a frame of the harness ({name})"
            return None
        if event == "object.__setattr__":
            obj, name, value = args
            if name in CODE_ATTRIBUTES and (
                    isinstance_(obj, function_type) and is_harness_code(obj.__code__) or is_harness_code(value)):
                return f"the harness's code ({name} set)"
            return None
        if event in ("code.__new__", "compile"):
            filename = args[1] if len(args) > 1 else None
            return f"the harness's code ({event} under a harness file's name)" if is_harness_file(filename) else None
        if event in ("function.__new__", "exec"):
            return f"the harness's code ({event})" if args and is_harness_code(args[0]) else None
        if event == "ctypes.dlsym" and len(args) > 1 and isinstance_(args[1], str) and args[1].startswith(
                ("Py", "_Py")):
            return f"the Python C API through ctypes ({args[1]})"
        if event in MEMORY:
            return f"raw memory through ctypes ({event})"
        return None

    watched = SEARCHES | MEMORY | FRAME_HOOKS | {"sys._getframe", "object.__getattr__", "object.__setattr__", "code.__new__",
                                   "compile", "function.__new__", "exec", "ctypes.dlsym"}

    def hook(event: str, args: tuple) -> None:
        # Fast path first: every audit event of the process comes here (a function's __code__ read is one).
        if event not in watched or event == "object.__getattr__" and args[1] not in FRAME_ATTRIBUTES:
            return
        me = get_ident()
        if me in inside:
            return
        inside.add(me)
        try:
            what = reaches(event, args)
            if what is None or not candidate_caused(getframe(1)):
                return
            if len(found) < MAX_FOUND and what not in found:
                found.append(what)
        finally:
            inside.discard(me)
        raise Blocked(f"the harness blocks {what}: candidate code must not reach the harness's objects")

    sys.addaudithook(hook)
    return Audit(found)
