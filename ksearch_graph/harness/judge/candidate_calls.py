"""The judge's side of every call the candidate's process makes: the inputs the judge made, lent in fresh memory;
the output read out of the judge's slot into the judge's own memory; the judge's clock around each timed call.

Nothing here believes the candidate's process: its messages are parsed strictly (wire.parse, in RunnerProcess),
its outputs are the judge's copies, the inputs it was given are checked in the judge's own mapping of them, and a
timed call's interval runs from before the judge writes its inputs to the judge's copy of the output
(time_bound.py).
"""

from __future__ import annotations

import os
import time

from ksearch_graph.harness._torch import load_torch
from ksearch_graph.harness.judge.runner_process import RunnerProcess
from ksearch_graph.harness.lending import LentInputs, lend, rebuild, take_output
from ksearch_graph.harness.policy import POLICY
from ksearch_graph.harness.reporting import Failure
from ksearch_graph.harness.shared_memory import ALIGN, Region, aligned
from ksearch_graph.harness.tensors import leaves
from ksearch_graph.harness.wire import (
    Burst,
    Calibrate,
    Call,
    Done,
    Go,
    Lend,
    Output,
    Ready,
    Stage,
    Staged,
    Taken,
    Timed,
    Warm,
    Warmed,
)


def output_bytes(value) -> int:
    """Bytes the slot needs for an output like ``value`` (its tensors, each aligned)."""
    torch = load_torch()
    return sum(aligned(t.numel() * t.element_size(), ALIGN) for t in leaves(value) if isinstance(t, torch.Tensor))


class TimedCall:
    """One timed call as the judge saw it: the candidate's reported [device, tail, probe, host] us, the judge's
    interval (us: host clock on a GPU, the candidate's tree's CPU time on CPU), the judge's copy of the output, and
    ``steps_us``: where in the interval the inputs were written, the L2 flushed and the answer came (for the timing
    trace: which step's jitter widens the slack)."""

    def __init__(self, times: list[float], span_us: float, output, steps_us: list[float]):
        self.times, self.span_us, self.output, self.steps_us = times, span_us, output, steps_us


class CandidateCalls:
    """Calls of the candidate's process for one evaluation: ``runner`` is the process, ``timer`` the judge's (its
    flush and synchronize), ``device`` the evaluation's."""

    def __init__(self, runner: RunnerProcess, timer, device: str):
        self.runner, self.timer, self.device = runner, timer, device
        self.slot: Region | None = None

    # -- the slot and the judge's clock ---------------------------------------------------------------------------

    def ensure_slot(self, nbytes: int, where: str) -> None:
        """A slot of at least ``nbytes`` lent to the candidate's process (a larger one replaces a smaller)."""
        if self.slot is not None and self.slot.nbytes >= nbytes:
            return
        if self.slot is not None:
            self.slot.close()
        self.slot = Region.make(max(nbytes, 1 << 16), self.device)
        self.runner.send(Lend(self.slot.nbytes), (self.slot.fd,))

    def take(self, output: dict):
        return take_output(self.slot, output, self.timer.sync)

    def clock(self) -> float:
        """Now, in us, as the judge measures a timed call: its host clock on a GPU; on CPU the CPU time the
        candidate's whole process tree has used (cgroup.py), which a loaded host's scheduler does not stretch."""
        if self.device == "cuda":
            return time.perf_counter() * 1e6
        return self.runner.account.cpu_us()

    def lent(self, inputs, filled: bool = True) -> LentInputs:
        """Fresh memory for ``inputs``: holding them, or (``filled`` False) still empty (``LentInputs.fill``)."""
        try:
            return lend(inputs) if filled else LentInputs(inputs)
        except ValueError as e:
            raise Failure("runtime_error", f"the task's inputs cannot be lent to the candidate (a task bug): {e}") from None

    # -- correctness and warm-up calls ------------------------------------------------------------------------------

    def call(self, workload: str, inputs, expected, first: bool, timeout_s: float, where: str):
        """One correctness call: (the judge's copy of the output, the inputs as the candidate's call left them in the
        judge's own mapping, host seconds the candidate's process reported, its flags)."""
        self.ensure_slot(output_bytes(expected), where)
        lent = self.lent(inputs)
        try:
            reply = self.runner.request(Call(workload, first, lent.tree, lent.spec), timeout_s, where,
                                        expect=Output, fds=lent.fds)
            out = self.take(reply.output)
            after = rebuild(lent.tree, lent.regions)  # the judge's own view of the memory it lent
            return out, after, reply.seconds, reply.flags, lent.regions
        except BaseException:
            lent.close()
            raise

    def warm(self, workload: str, inputs, timeout_s: float, where: str) -> float:
        lent = self.lent(inputs)
        try:
            return self.runner.request(Warm(workload, lent.tree, lent.spec), timeout_s, where, expect=Warmed,
                                       fds=lent.fds).seconds
        finally:
            lent.close()

    # -- timed calls ------------------------------------------------------------------------------------------------

    def calibrate(self, workload: str, inputs, expected, count: int, timeout_s: float) -> list[TimedCall]:
        """Before any candidate code exists: ``count`` timed calls of a function that does no work but return
        empty tensors shaped like ``expected``, each on a fresh copy of ``inputs``, through the path the candidate's
        will take (time_bound.py's calibration)."""
        where = f"workload {workload}, calibrating the judge's clock"
        torch = load_torch()
        outs = [t for t in leaves(expected) if isinstance(t, torch.Tensor)]
        self.ensure_slot(output_bytes(expected), where)
        spec = [[list(t.shape), str(t.dtype).removeprefix("torch.")] for t in outs]
        first = self.runner.request(Calibrate(workload, count, spec), timeout_s, where, expect=(Ready, Timed))
        calls, _, _ = self.serve(first, lambda k: inputs, count, time.monotonic() + timeout_s * (count + 1), where)
        return calls

    def burst(self, workload: str, heat_inputs, make_inputs, count: int, first: bool, deadline: float,
              where: str) -> tuple[list[TimedCall], float | None, dict]:
        """A burst of ``count`` timed calls after a heat on ``heat_inputs``; ``make_inputs(k)``: call k's inputs,
        made only when the candidate's process is ready for it. (calls, untimed median us, flags)."""
        heat = self.lent(heat_inputs)
        try:
            reply = self.runner.request(Burst(workload, count, first, heat.tree, heat.spec),
                                        deadline - time.monotonic(), where, expect=(Ready, Timed), fds=heat.fds)
            return self.serve(reply, make_inputs, count, deadline, where)
        finally:
            heat.close()

    def serve(self, reply, make_inputs, count: int, deadline: float, where: str) -> tuple:
        """The judge's side of a burst, from the candidate's first ``Ready``: each call's input memory lent empty
        (``Stage``; the candidate's process maps it), then the judge's clock starts, the inputs are written in, the
        L2 flushed, ``Go``, ``Done`` (the output copied out; the clock stops), ``Taken``. Mapping lent memory costs
        a GPU process a few hundred us of driver calls that vary from call to call: outside the clock, that jitter
        does not widen the judge's slack (time_bound.py)."""
        calls = []
        while isinstance(reply, Ready):
            k = len(calls)
            if reply.index != k or k >= count:
                raise Failure("suspicious", f"{where}: the candidate's process asked for timed call "
                              f"{reply.index + 1} out of turn (next: {k + 1} of {count})")
            lent = self.lent(make_inputs(k), filled=False)
            try:
                staged = self.runner.request(Stage(k, lent.tree, lent.spec), deadline - time.monotonic(), where,
                                             expect=Staged, fds=lent.fds)
                self.in_turn(staged, k, where)
                self.timer.sync()
                start = self.clock()
                lent.fill()
                written = self.clock() - start
                self.timer.flush_l2()  # after the inputs were written: the call finds none of them cached
                self.timer.sync()
                flushed = self.clock() - start
                done = self.runner.request(Go(k), deadline - time.monotonic(), where, expect=Done,
                                           spin_s=POLICY.spin_wait_s if self.device == "cuda" else 0.0)
                answered = self.clock() - start
                self.in_turn(done, k, where)
                out = self.take(done.output)
                span = self.clock() - start
            finally:
                lent.close()
            calls.append(TimedCall(done.times, span, out, [written, flushed, answered]))
            reply = self.runner.request(Taken(k), deadline - time.monotonic(), where, expect=(Ready, Timed))
        if len(calls) != count:
            raise Failure("suspicious", f"{where}: the candidate's process ended the burst after {len(calls)} of "
                          f"{count} timed calls")
        return calls, reply.untimed_median_us, reply.flags

    @staticmethod
    def in_turn(reply, k: int, where: str) -> None:
        if reply.index != k:
            raise Failure("suspicious", f"{where}: the candidate's process answered for timed call "
                          f"{reply.index + 1}, not {k + 1}")


def reference_files(task_dir: str, limit: int = 8 << 20, largest: int = 1 << 20) -> dict[str, str]:
    """The task folder's text files ({relative path: text}), as sent to the candidate's process: the reference
    module and whatever it and the candidate import from beside it (a GPU MODE problem's task.py). Files over
    ``largest`` bytes (data: make_inputs runs in the judge only) and binary files stay behind."""
    files, total = {}, 0
    for root, dirs, names in os.walk(task_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__pycache__")))
        for name in sorted(names):
            path = os.path.join(root, name)
            if not os.path.isfile(path) or os.path.getsize(path) > largest:
                continue
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
            except (UnicodeDecodeError, OSError):
                continue
            files[os.path.relpath(path, task_dir)] = text
            total += len(text)
    if total > limit:
        raise Failure("runtime_error", f"the task folder's text files hold {total} bytes, more than the {limit} the "
                      "harness sends to the candidate's process")
    return files
