"""What a candidate may not leave behind (harness/guards.py, and the timer's garbage-collector rule): interpreter
hooks and replaced library functions."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from ksearch_graph.harness import _torch, guards
from ksearch_graph.harness.timer import Timer
from ksearch_graph.harness.timing import timed_burst

CUDA = torch.cuda.is_available()


def _fake_cuda_timer(seen: list) -> Timer:
    """A CPU timer that takes the CUDA path with fake calls that log whether the collector is on at each step."""
    import gc

    _torch.load_torch()
    timer = Timer("cpu")
    timer.cuda, timer.runtime = True, None
    timer.idle_gap_us = lambda: seen.append(("probe", gc.isenabled())) or 0.0
    timer.cover = lambda: seen.append(("cover", gc.isenabled()))
    timer.Event = lambda enable_timing=False: object()
    timer.record = lambda event: None
    timer.event_sync = lambda event: seen.append(("idle", gc.isenabled()))
    timer.sync = lambda: None
    timer.elapsed = lambda a, b: 0.01
    return timer


def test_the_garbage_collector_is_off_from_the_probe_to_the_outputs_copy_and_back_on_after():
    """A collection inside a timed call read as device time on an H200 (a 32 us matmul timed 101-188 us, and tails
    the escape check charged); one between the call and the output's copy would run the candidate's gc.callbacks
    there. timing.timed_burst keeps the collector off from the idle probe to the copy (``deliver``)."""
    import gc

    seen = []
    timer = _fake_cuda_timer(seen)
    gc.enable()
    try:
        timed_burst(timer, 1, lambda k: (lambda: seen.append(("call", gc.isenabled())), ()),
                    lambda k, out, times: seen.append(("copy", gc.isenabled())))
        assert seen == [("probe", False), ("probe", False), ("cover", False), ("call", False), ("idle", False),
                        ("copy", False)]
        assert gc.isenabled()

        def fails():
            raise RuntimeError("the candidate's")

        with pytest.raises(RuntimeError):
            timed_burst(timer, 1, lambda k: (fails, ()), lambda k, out, times: None)
        assert gc.isenabled()  # back on after a call that raised

        gc.disable()  # a process that had it off (the candidate's choice) keeps it off
        timed_burst(timer, 1, lambda k: (lambda: None, ()), lambda k, out, times: None)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_hook_installed_while_the_harness_waits_for_the_device_is_found():
    """The wait for the device releases the GIL, so a thread of the candidate's can install a hook after the check
    right behind the call; the fake synchronize plays that thread (a gc callback, the collector turned on). The
    check after the output's copy finds both, and removes the callback."""
    import gc

    torch = _torch.load_torch()
    timer = _fake_cuda_timer([])
    timer.hooks = guards.InterpreterHooks()

    def callback(phase, info):
        pass

    def a_thread_acts():
        if callback not in gc.callbacks:
            gc.callbacks.append(callback)
        gc.enable()

    timer.sync = a_thread_acts
    outs = []
    try:
        timed_burst(timer, 1, lambda k: (lambda: torch.ones(3), ()), lambda k, out, times: outs.append(out))
        assert torch.equal(outs[0], torch.ones(3))
        assert timer.hooks.found == ["the garbage collector turned on while the harness waited",
                                     "a garbage-collector callback (gc.callbacks)"], timer.hooks.found
        assert callback not in gc.callbacks
    finally:
        if callback in gc.callbacks:
            gc.callbacks.remove(callback)
        gc.enable()


def test_a_replaced_torch_function_is_named_and_torch_wrapping_its_own_is_not():
    """LibraryPatches, in a fresh process (torch._dynamo, once imported, has already wrapped torch.manual_seed):
    torch's own wrapper is not a replacement; a replaced module function, a method put on torch.Tensor over
    TensorBase's, and a replaced class method are named; then the ways around identity found in review: torch's
    wrapper around the candidate's function, a swapped __code__, a deleted function, a dunder added to
    torch.Tensor, and the task module's torch and make_inputs (its data is not watched)."""
    script = r"""
from ksearch_graph.harness import _torch, guards
torch = _torch.load_torch()
patches = guards.LibraryPatches()
import torch._dynamo  # wraps torch.manual_seed (functools.wraps, torch's own code)
assert torch.manual_seed.__wrapped__ is not None
assert patches.found() == [], patches.found()
torch.randn = lambda *a, **k: None
torch.Tensor.to = lambda self, *a, **k: self
torch.cuda.Event.elapsed_time = lambda self, end: 0.0
print(sorted(patches.found()))

import types
import torch.nn.functional as F
task = types.ModuleType("task")
exec("import torch\ncache = {}\ndef make_inputs(p, s, d):\n    return (torch.ones(2),)\n"
     "def reference(x):\n    return x\n", vars(task))
patches = guards.LibraryPatches(task)
relu = F.relu
fake = torch._disable_dynamo(lambda *a, **k: relu(*a, **k))  # torch's wrapper, around the candidate's function
fake.__wrapped__ = relu
F.relu = fake
torch.cuda.current_stream.__code__ = (lambda device=None: None).__code__  # same object, other code
del F.gelu  # a module __getattr__ could answer for it
torch.Tensor.__getattribute__ = lambda self, name: object.__getattribute__(self, name)
task.torch = types.SimpleNamespace()
task.make_inputs.__defaults__ = (1,)
task.reference = lambda x: x  # the runner wraps it itself
task.cache["k"] = 1  # data
print(sorted(patches.found()))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    first, second = done.stdout.strip().splitlines()
    assert first == str(sorted(["torch.randn", "torch.Tensor.to", "torch.cuda.Event.elapsed_time"]))
    assert second == str(sorted([
        "torch.nn.functional.relu", "torch.cuda.current_stream (its code)", "torch.nn.functional.gelu (deleted)",
        "torch.Tensor.__getattribute__", "the task's reference.py.torch", "the task's reference.py.make_inputs (its code)"]))
