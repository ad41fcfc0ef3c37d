"""The timed call, done the same way for the reference (in the judge) and the candidate (in its process): heat,
fillers, launch cover, events, the idle probe. The judge's flush of the L2 comes before either."""

from __future__ import annotations

import contextlib
import gc
import time

from ksearch_graph.harness._torch import load_torch
from ksearch_graph.harness.gpu import CudaRuntime, PowerGauge, launch_cover
from ksearch_graph.harness.guards import InterpreterHooks
from ksearch_graph.harness.policy import POLICY
from ksearch_graph.harness.reporting import progress
from ksearch_graph.harness.tensors import leaves, output_items, small_block_sizes


class Timer:
    """One timed call, done the same way for the reference (in the judge) and the candidate (here).

    On CUDA: L2 flushed by writing 256 MB, events around the call on the current stream, then a device-wide
    synchronize and a third event: the gap between the call's end event and the device going idle is work the call
    left running elsewhere (a side stream, a thread). The functions used are bound here, before any candidate code is
    imported, so a candidate that patches ``torch.cuda.Event.elapsed_time`` or ``synchronize`` patches copies we do
    not call.
    """

    # What the harness itself changes on a timer once it is made; integrity.py watches every other attribute.
    STATE = ("untimed_us", "heated", "limited", "limited_by", "heat_trace", "spent_s", "output_small_sizes")

    def __init__(self, device: str):
        torch = load_torch()
        self.cuda = device == "cuda"
        self.perf = time.perf_counter
        # On CPU a call is timed in CPU time (all of the process's threads): what the judge can check against the CPU
        # time of the candidate's whole process tree (time_bound.py), and what a loaded host's scheduler does not
        # stretch; CPU timings only order candidates.
        self.cpu_clock = time.process_time
        # Python's garbage collector stays off through each timed call (see time); bound here like the CUDA calls.
        self.gc_disable, self.gc_enable, self.gc_isenabled = gc.disable, gc.enable, gc.isenabled
        self.hooks: InterpreterHooks | None = None  # the candidate's process sets one (see InterpreterHooks)
        self.guard = None  # the candidate's process: integrity.py's check, run before each timed call (forgery.py)
        self.zero_ = torch.Tensor.zero_
        self.empty, self.uint8 = torch.empty, torch.uint8
        self.output_small_sizes: list[int] = []  # bytes of the small tensors of the last untimed call's output
        self.untimed_us: list[float] = []  # device times of heat and filler calls, for the caller's consistency check
        self.heated = False  # the first heat of this process may start from a cool GPU
        self.limited = True  # the current workload drives the GPU to its power limit (see heat)
        # Why the last first heat called it limited ("power", "clock", "slowdown", "no power reading", "no NVML";
        # None: not limited), and its windows as (mean call us, clock held, W or None): diagnostics show them.
        self.limited_by: str | None = None
        self.heat_trace: list[tuple[float, bool | None, float | None]] = []
        self.spent_s = {"heat": 0.0, "fill": 0.0}  # wall time of heats and fillers, for the evaluation's breakdown
        self.gauge = None  # PowerGauge on CUDA
        if self.cuda:
            self.runtime = CudaRuntime()  # first: it sets how the host waits, before the context exists
            self.flush = torch.empty(POLICY.flush_bytes, dtype=torch.uint8, device=device)
            # No Python of torch's between these and the C calls: torch.cuda.Event() runs the class's __new__,
            # Event.record looks torch.cuda.current_stream up when called, torch.cuda.synchronize torch.cuda.device,
            # all after the inputs exist and before the start event. Code a candidate put there could compute its
            # output untimed (tests/cheats/patch_stream.py; LibraryPatches names such replacements too).
            event_new, stream_new = torch.cuda.Event.__new__, torch.cuda.Stream.__new__
            Event, Stream, get_stream = torch.cuda.Event, torch.cuda.Stream, torch._C._cuda_getCurrentStream
            record, device_index = torch.cuda.Event.record, torch.cuda.current_device()

            def current_stream():
                stream_id, index, kind = get_stream(device_index)
                return stream_new(Stream, stream_id=stream_id, device_index=index, device_type=kind)

            self.Event = lambda enable_timing=True: event_new(Event, enable_timing=enable_timing)
            self.record = lambda event: record(event, current_stream())
            # The C methods under torch's Python ones: nothing a candidate can rebind runs between them and the clock.
            base = torch._C._CudaEventBase
            self.elapsed = getattr(base, "elapsed_time", torch.cuda.Event.elapsed_time)
            self.event_sync = getattr(base, "synchronize", torch.cuda.Event.synchronize)
            self.sync = torch._C._cuda_synchronize  # device-wide
            self.gauge = PowerGauge(self.runtime.pci_bus_id())
            # The cover only holds the GPU: the judge flushes the L2 itself before each timed call (flush_l2).
            self.cover, self.cover_kind = launch_cover(torch.empty(4096, dtype=torch.uint8, device=device))
        else:
            self.sync = lambda: None
            self.elapsed = self.record = self.event_sync = None  # CUDA only
            self.flush = None
            self.runtime = None
            self.cover, self.cover_kind = None, "none (CPU)"
        self.launch_cover, self.end_to_end = self.cover, False  # see use_timing

    def use_timing(self, mode: str) -> None:
        """The task's timing mode (task.json "timing"). "device": each timed call behind the launch cover, so only the
        GPU's time counts; "end_to_end": the L2 flushed and the device idle before the start event, which then runs
        when the host records it, so the call's own host launch gaps count too."""
        self.end_to_end = mode == "end_to_end"
        self.cover = self.idle_start if self.end_to_end and self.cuda else self.launch_cover

    def idle_start(self) -> None:
        """``cover``'s stand-in under end_to_end timing: the device idle (the judge flushed the L2 before)."""
        self.sync()

    def flush_l2(self) -> None:
        """Write the 256 MB flush buffer, evicting the L2: the judge does it after making a timed call's inputs and
        before the call (its own, or the candidate's, which it then starts), so no call finds its inputs cached."""
        if self.cuda:
            self.zero_(self.flush)

    def before_call(self) -> float:
        """What precedes a timed call outside its measured interval: the integrity guard (the candidate's process),
        persisting L2 lines evicted, and the idle probe (us): the shorter of two readings of how long this process
        takes to see an idle device (``time_call``'s tail is judged against it; docs/timing.md, "What the judge
        checks")."""
        if self.guard is not None:
            self.guard()
        if not self.cuda:
            return 0.0
        if self.runtime is not None:
            self.runtime.reset_persisting_l2()
        return min(self.idle_gap_us(), self.idle_gap_us())

    def time_call(self, fn, args) -> tuple:
        """(output, device us, tail us, host us, launch us) of one call: on CUDA behind the launch cover (its hold
        covers the host's launch of the call), events around it, then a device-wide synchronize and a third event;
        the tail is how long the device stayed busy after the call's end event (work left on another stream); the
        launch is the host's time from the start event to the call's return (beyond the cover's hold it is timed on
        the device too). The caller keeps the garbage collector off from here until the output is copied
        (``collector_off``)."""
        # What the call's measurement uses, bound before the candidate's code runs in it: what the call rebinds on
        # the timer reaches no clock read of this call, and the guard (integrity.py) sees it before the next.
        perf, elapsed, sync, record, event_sync, hooks, gc_disable = (
            self.perf, self.elapsed, self.sync, self.record, self.event_sync, self.hooks, self.gc_disable)
        if not self.cuda:
            cpu = self.cpu_clock
            t0 = cpu()
            out = fn(*args)
            gc_disable()  # the candidate may have turned it on
            if hooks is not None:
                hooks.disarm()
            us = (cpu() - t0) * 1e6
            return out, us, 0.0, us, us
        start, end, idle = self.Event(enable_timing=True), self.Event(enable_timing=True), self.Event(enable_timing=True)
        self.cover()  # holds the GPU while the call is launched (see POLICY.cover_s)
        h0 = perf()
        record(start)
        out = fn(*args)
        h_launched = perf()
        gc_disable()  # the candidate may have turned it on
        if hooks is not None:  # first: what a hook does before this is timed (see InterpreterHooks)
            hooks.disarm()
        record(end)
        sync()  # waits for every stream of the device
        h1 = perf()
        record(idle)
        event_sync(idle)
        return out, elapsed(start, end) * 1e3, elapsed(end, idle) * 1e3, (h1 - h0) * 1e6, (h_launched - h0) * 1e6

    @contextlib.contextmanager
    def collector_off(self):
        collecting = self.gc_isenabled()
        self.gc_disable()
        try:
            yield
        finally:
            if collecting:
                self.gc_enable()

    def back_to_back(self, fn, args, seconds: float, min_calls: int = 1, while_busy=None) -> None:
        """Untimed calls as ``do_bench`` makes them: flush, call, flush, call, ... with no synchronize between, so the
        GPU stays as busy as under sustained load; each call's device time goes to ``untimed_us``. At most two calls
        run ahead of the host, so the load ends soon after ``seconds``. ``while_busy()``, if given, runs while the
        last of them still do."""
        if not self.cuda:
            return
        # One clock for the whole loop: a candidate call that rebinds the timer's clock inside it must not leave a
        # deadline of one clock compared with readings of another (a loop without end); the next timed call's
        # integrity check finds the rebinding.
        perf = self.perf
        pairs, until = [], perf() + seconds
        while len(pairs) < min_calls or perf() < until:
            start, end = self.Event(enable_timing=True), self.Event(enable_timing=True)
            self.zero_(self.flush)
            self.record(start)
            out = fn(*args)
            self.record(end)
            if not pairs:  # for reserve_small_blocks
                self.output_small_sizes = small_block_sizes(output_items(out))
            del out
            pairs.append((start, end))
            if len(pairs) > 2:
                self.event_sync(pairs[-3][1])
        if while_busy is not None:
            while_busy()
        self.sync()
        self.untimed_us += [self.elapsed(a, b) * 1e3 for a, b in pairs]

    @property
    def power_limited(self) -> bool:
        """Whether the current workload's first heat found the GPU at its power limit (never on CPU)."""
        return bool(self.cuda and self.limited)

    def heat(self, fn, args, first: bool) -> None:
        """The candidate's own calls back to back before a burst of timed calls; before a workload's ``first`` burst,
        until a window of them is no slower than the one before, and long enough for a power-limited kernel to
        settle (see POLICY.heat_min_s); that heat also says whether this workload is power-limited."""
        t0 = self.perf()
        try:
            self._heat(fn, args, first)
        finally:
            self.spent_s["heat"] += self.perf() - t0

    def _heat(self, fn, args, first: bool) -> None:
        if not first:
            self.back_to_back(fn, args, POLICY.later_heat_s(self.limited), min_calls=2)
            return
        least = (POLICY.first_heat_min_s, POLICY.unlimited_heat_windows[1]) if not self.heated else (
            POLICY.heat_min_s, POLICY.unlimited_heat_windows[0])
        gauge = self.gauge if self.gauge is not None and self.gauge.available else None
        perf = self.perf  # one clock for the loop (see back_to_back)
        windows, started = [], perf()
        seen = gauge is None  # without NVML: limited (the safe side), no reading to wait for
        # A power reading counts from its second change since the heat began: the first refresh can cover time before
        # the heat. The clock and its reasons lag the load, so they count only where the driver has no power reading
        # (docs/timing.md, "Which kernels are power-limited").
        changes, last = 0, gauge.read()[1] if gauge is not None else None
        self.heated, self.heat_trace, why = True, [], "no NVML" if gauge is None else None
        peak = 0.0  # the highest power reading that counts (W)
        while self.cuda and perf() - started < POLICY.heat_max_s:
            done, now = len(self.untimed_us), []
            # NVML is read while calls still run: a GPU idle for a moment reads top clock again.
            self.back_to_back(fn, args, POLICY.heat_window_s, while_busy=None if gauge is None else lambda: now.append(  # noqa: B023 (called in this pass)
                gauge.read()))
            windows.append(sum(self.untimed_us[done:]) / max(1, len(self.untimed_us) - done))
            held, watts = now[-1] if now else (None, None)
            self.heat_trace.append((windows[-1], held, watts))
            if now:
                if not gauge.has_power:  # the clock, from the second window (in the first it may ramp up)
                    why = why or ("clock" if held and len(windows) > 1 else None)
                    seen = seen or len(windows) > 1
                elif watts is not None and watts != last:  # None: this query failed
                    changes, last = changes + 1, watts
                    if changes >= 2:
                        why, seen, peak = why or ("power" if gauge.at_limit(watts) else None), True, max(peak, watts)
            near_cap = gauge is not None and (not gauge.has_power or gauge.at_limit(peak, POLICY.slowdown_power))
            if near_cap and len(windows) > 1 and windows[-1] > min(windows[1:]) * (1 + POLICY.load_slowdown):
                why = why or "slowdown"
            limited = why is not None
            settled = perf() - started >= least[0] if limited else seen and len(windows) >= least[1]
            if settled and len(windows) > 1 and windows[-1] <= windows[-2] * 1.01:
                break
        if not seen:  # no fresh power reading within POLICY.heat_max_s: the safe side
            progress(f"heat: no NVML power reading refreshed within {POLICY.heat_max_s:g} s; counted as power-limited")
            why = why or "no power reading"
        self.limited, self.limited_by = why is not None, why

    def fill(self, fn, args, gap_s: float, call_us: float) -> None:
        """Between two timed calls of a power-limited workload, before the next one's inputs exist: enough untimed
        calls that calls fill POLICY.fill_duty of the time, given the ``gap_s`` of other work around the last timed call
        (of ``call_us``)."""
        duty = POLICY.fill_duty
        seconds = min(duty / (1 - duty) * gap_s - call_us * 1e-6, POLICY.fill_max * call_us * 1e-6)
        if self.limited and seconds > 0:
            t0 = self.perf()
            self.back_to_back(fn, args, seconds)
            self.spent_s["fill"] += self.perf() - t0

    def reserve_small_blocks(self, held, count: int) -> None:
        """Before a burst of ``count`` calls, each holding what ``held`` (one call's inputs as kept) holds, right after
        its heat: make and free the small blocks the burst will hold (each call's inputs and output copy, and two
        outputs), so no timed call's own allocation is a cudaMalloc, which waits for the launch cover. The output's
        sizes are those of the first call of the last untimed run (``back_to_back``: the heat's last window), not of
        a call of its own. Only small-pool blocks (up to 1 MB) are reserved (docs/timing.md, "The launch cover and
        the flush")."""
        if not self.cuda:
            return
        sizes = small_block_sizes(leaves(held)) + self.output_small_sizes
        blocks = [self.empty(n, dtype=self.uint8, device="cuda") for _ in range(count + 2) for n in sizes]
        del blocks

    def idle_gap_us(self) -> float:
        """Device time between an event and the next one this process records after a device-wide synchronize, on
        an idle device: the same steps as the tail of a timed call, with nothing left running."""
        self.sync()
        a, b = self.Event(enable_timing=True), self.Event(enable_timing=True)
        self.record(a)
        self.sync()
        self.record(b)
        self.event_sync(b)
        return self.elapsed(a, b) * 1e3

