"""What a candidate's code may not leave behind in its process: interpreter hooks that run its code between a timed
call and the copy of its output, and replaced library functions the harness's own steps go through."""

from __future__ import annotations

import gc
import importlib
import os
import signal
import sys
import types

from ksearch_graph.harness._torch import load_torch


class InterpreterHooks:
    """Ways Python runs a candidate's code between its call's return and the copy of its output with no call of the
    candidate's in sight (docs/harness.md, "Code that would run outside the timer"): a profile or trace function
    (also one set from C), a sys.monitoring tool, a garbage-collector callback, a signal handler, torch function or
    dispatch modes, dynamo's frame callback, a Python kernel registered for an aten operator (the copy's clone). No
    kernel needs one, so ``disarm``, right after each of the candidate's calls and before its end event (what a hook
    does before is timed), names what was added since the candidate was imported, and resets what it can; the judge
    fails the candidate as suspicious. Bound here, before any candidate code is imported.

    A thread of the candidate's can install a hook after ``disarm`` (this thread releases the GIL while it waits for
    the device), so ``recheck`` looks again once the output is copied: a hook that was there then is found.
    Not covered: such a hook that removes itself before ``recheck``, and kernels registered
    for aten operators from C++. The fix for the whole class is a copy queued on the device right behind the end
    event, made without torch's dispatcher; it changes the escape check, so it waits for a GPU run."""

    def __init__(self):
        torch = load_torch()
        import _signal  # signal.getsignal is Python code a candidate can patch; this is the C function

        self.getprofile, self.setprofile, self.gettrace, self.settrace = (sys.getprofile, sys.setprofile,
                                                                          sys.gettrace, sys.settrace)
        self.profile, self.trace = sys.getprofile(), sys.gettrace()
        self.callbacks = gc.callbacks  # the collector's own list (rebinding gc.callbacks does not replace it)
        self.callbacks_before = list(self.callbacks)
        self.monitoring = getattr(sys, "monitoring", None)  # Python 3.12+
        self.monitored_before = self._monitored()
        self.getsignal = _signal.getsignal
        self.signals = [s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)]
        self.handlers_before = [self.getsignal(s) for s in self.signals]
        self.function_modes = torch._C._len_torch_function_stack
        self.dispatch_modes = torch._C._len_torch_dispatch_stack
        self.modes_before = (self.function_modes(), self.dispatch_modes())
        try:
            from torch._C._dynamo import eval_frame
            self.get_frame_callback, self.set_frame_callback = (eval_frame.get_eval_frame_callback,
                                                                eval_frame.set_eval_frame)
        except (ImportError, AttributeError):
            self.get_frame_callback = self.set_frame_callback = None
        self.frame_callback = self.get_frame_callback() if self.get_frame_callback else None
        library = importlib.import_module("torch.library")
        self.library_impls = getattr(library, "_impls", set())  # "namespace/op/dispatch key" from Python
        self.impls_seen = set(self.library_impls)  # torch registers more itself (torch.compile: ~200, Meta mostly)
        self.found: list[str] = []

    def _monitored(self) -> list:
        """Per sys.monitoring tool: its name and its global events (a freed tool's events stay live)."""
        if self.monitoring is None:
            return []
        return [(self.monitoring.get_tool(t), self.monitoring.get_events(t)) for t in range(6)]

    def disarm(self) -> None:
        found = []
        if self.getprofile() is not self.profile or self.gettrace() is not self.trace:
            found.append("a profile or trace function (sys.setprofile / sys.settrace)")
            self.setprofile(self.profile)
            self.settrace(self.trace)
        # One set from C (PyEval_SetProfile, invisible to sys.getprofile) raises the same audit event as
        # sys.setprofile: audit.py blocks it when it is set, so there is nothing to reset here.
        if self._monitored() != self.monitored_before:
            found.append("a sys.monitoring tool")
        if self.callbacks != self.callbacks_before:
            self.callbacks[:] = self.callbacks_before
            found.append("a garbage-collector callback (gc.callbacks)")
        # Compared by identity: a handler's __eq__ is the candidate's. Left in place: the default action of a
        # signal the candidate armed may be to end the process before the judge hears why.
        found += [f"a handler for signal {s}" for s, before in zip(self.signals, self.handlers_before)
                  if self.getsignal(s) is not before]
        if (self.function_modes(), self.dispatch_modes()) != self.modes_before:
            found.append("a torch function or dispatch mode left entered")
        if self.get_frame_callback is not None and self.get_frame_callback() is not self.frame_callback:
            self.set_frame_callback(self.frame_callback)
            found.append("a frame evaluation callback (torch._C._dynamo.eval_frame.set_eval_frame)")
        if len(self.library_impls) != len(self.impls_seen):
            added = set(self.library_impls) - self.impls_seen
            self.impls_seen |= added
            if any(_copies_output(key) for key in added):
                found.append("a Python kernel for an operator that copies tensors (torch.library)")
        self.found += [f for f in found if f not in self.found]

    def recheck(self, collecting: bool) -> None:
        """``disarm`` again after the output's copy; ``collecting``: the garbage collector was on before the copy,
        which only a thread of the candidate's does while this thread waits (the collector is off from the call on;
        its callbacks could have finished the output inside the copy)."""
        if collecting and "the garbage collector turned on while the harness waited" not in self.found:
            self.found.append("the garbage collector turned on while the harness waited")
        self.disarm()


class LibraryPatches:
    """The functions of torch and Triton that the harness's own steps go through, as they were before the candidate
    was imported (docs/harness.md, "Timing cheats"). A candidate that replaced one runs its code where its
    inputs already exist and no timer runs: torch.randn inside the task's ``make_inputs``, torch.cuda.Event.__new__
    or torch.cuda.current_stream (which Event.record looks up) before the start event, Triton's launcher before the
    launch cover; it could compute its output there (tests/cheats/patch_inputs.py, patch_stream.py). No kernel needs
    to, so ``found()`` names what was replaced and the judge fails the candidate as suspicious.

    Watched by identity, and a Python function also by its code, defaults and closure (swapping ``__code__`` keeps
    the identity): modules' functions and classes, and the module's own type; classes through their whole MRO, with
    any name added that hides a base class's or is a dunder (``__getattribute__``); objects (Triton's driver): every
    attribute set. A watched name deleted counts too (a module ``__getattr__`` could answer for it). Lazily added
    submodules are not replacements, nor is torch's own wrapper of ``torch.manual_seed`` that importing torch._dynamo
    makes (its ``__wrapped__`` and only function in its closure is the original)."""

    def __init__(self, task_module: types.ModuleType | None = None):
        """``task_module``: the task's reference.py, whose ``make_inputs`` runs here; its functions, classes and
        modules (its ``torch`` too) are watched, but ``reference``, which the runner wraps to count the candidate's
        calls of it."""
        torch = load_torch()
        import torch.backends.cuda  # noqa: F811  (the submodule loaded; the name stays load_torch()'s torch)
        import torch.nn.functional as F

        spaces = [("torch", torch), ("torch.nn.functional", F), ("torch.random", torch.random),
                  ("torch.cuda", torch.cuda), ("torch.backends.cuda", torch.backends.cuda),
                  ("torch.Tensor", torch.Tensor), ("torch.cuda.Event", torch.cuda.Event),
                  ("torch.cuda.Stream", torch.cuda.Stream)]
        triton = sys.modules.get("triton.runtime.driver")  # imported by the launch cover, on CUDA
        if triton is not None:
            jit, compiler = sys.modules.get("triton.runtime.jit"), sys.modules.get("triton.compiler.compiler")
            spaces += [("triton.runtime.driver", triton), ("triton driver config", triton.driver)]
            active = getattr(triton.driver, "_active", None)
            if active is not None:
                spaces += [("triton's active driver", active), ("triton's active driver", type(active))]
            spaces += [(f"{m.__name__}.{c}", getattr(m, c)) for m, names in (
                (jit, ("JITFunction", "KernelInterface")), (compiler, ("CompiledKernel",))) if m is not None
                for c in names if hasattr(m, c)]
        # (label, namespace dict (live), {name: (value, its code state) before}, names before, names of its bases)
        self.kept = []
        self.modules = [(label, space, type(space)) for label, space in spaces if isinstance(space, types.ModuleType)]
        for label, space in spaces:
            if isinstance(space, type):
                mro = space.__mro__[:-1]  # object's own slots are not ours to watch
                for i, klass in enumerate(mro):
                    self.kept.append((f"{label} ({klass.__name__})" if klass is not space else label, vars(klass),
                                      self._state(vars(klass), lambda v: callable(v) or hasattr(v, "__func__")),
                                      set(vars(klass)), set().union(*(vars(base) for base in mro[i + 1:]))))
            elif isinstance(space, types.ModuleType):
                self.kept.append((label, vars(space), self._state(
                    vars(space), lambda v: callable(v) and not isinstance(v, types.ModuleType)), None, None))
            else:  # an attribute still None (not made yet) is not watched: Triton fills some in lazily
                self.kept.append((label, vars(space), self._state(vars(space), lambda v: v is not None), None, None))
        if task_module is not None:
            # Functions, classes and modules only: a task may keep data (a cache, a counter) in its globals.
            state = self._state(vars(task_module), lambda v: callable(v) or isinstance(v, types.ModuleType))
            state.pop("reference", None)
            self.kept.append(("the task's reference.py", vars(task_module), state, None, None))

    @staticmethod
    def _code(value) -> tuple | None:
        """What a Python function runs, which can change while the function stays the same object."""
        fn = getattr(value, "__func__", value)  # classmethod, staticmethod
        if not isinstance(fn, types.FunctionType):
            return None
        return fn.__code__, fn.__defaults__, fn.__kwdefaults__, tuple(map(id, _cells(fn)))

    def _state(self, namespace, watched) -> dict:
        return {k: (v, self._code(v)) for k, v in namespace.items() if watched(v)}

    @staticmethod
    def _torch_wrapper(value, before) -> bool:
        """torch._dynamo's wrapper of one of torch's functions (torch/_compile.py), around the original alone."""
        if not isinstance(value, types.FunctionType) or getattr(value, "__wrapped__", None) is not before:
            return False
        inside = [c for c in _cells(value) if callable(c)]
        return inside == [before] and value.__code__.co_filename.endswith(os.path.join("torch", "_compile.py"))

    def found(self) -> list[str]:
        out = [f"{label} (its type)" for label, module, kind in self.modules if type(module) is not kind]
        for label, now, before, names, hidden in self.kept:
            for name, (value, code) in before.items():
                if name not in now:
                    out.append(f"{label}.{name} (deleted)")
                    continue
                current = now[name]
                if current is value:
                    if code is not None and self._code(current) != code:
                        out.append(f"{label}.{name} (its code)")
                elif not self._torch_wrapper(current, value):
                    out.append(f"{label}.{name}")
            if names is not None:
                out += [f"{label}.{name}" for name in now.keys() - names
                        if name in hidden or (name.startswith("__") and name.endswith("__"))]
        return out


def _cells(fn: types.FunctionType) -> list:
    """What a function's closure holds (an empty cell, not yet assigned, as None)."""
    out = []
    for cell in fn.__closure__ or ():
        try:
            out.append(cell.cell_contents)
        except ValueError:
            out.append(None)
    return out


# The aten operators a copy of an output goes through (snapshot: detach, clone; clone: empty_like, empty_strided or
# empty, copy_).
_COPY_OPS = {"alias", "clone", "copy_", "detach", "empty", "empty_like", "empty_strided", "_to_copy"}


def _copies_output(library_key: str) -> bool:
    """A torch.library registration ("namespace/op.overload/dispatch key") that would run inside the copy; Meta
    kernels only compute shapes (torch.compile registers some for these operators itself)."""
    namespace, op, key = (library_key.split("/") + ["", "", ""])[:3]
    return namespace == "aten" and op.split(".")[0] in _COPY_OPS and key != "Meta"
