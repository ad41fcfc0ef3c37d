"""How many timed calls, in which bursts, and what counts: the burst loop, the stopping rule, the side-stream rule
and the burst sizes."""

from __future__ import annotations

import math
import statistics
import time
from typing import TYPE_CHECKING

from ksearch_graph.harness._torch import load_torch
from ksearch_graph.harness.policy import POLICY

if TYPE_CHECKING:
    from ksearch_graph.harness.timer import Timer


def timed_burst(timer: Timer, count: int, next_call, deliver, filler=None, held=None) -> None:
    """Time ``count`` calls one after another, each on inputs ``next_call(k)`` provides just before it (returning (fn,
    args)); ``deliver(k, output, [device us, tail us, probe us, host us, launch us])`` takes each call's output at once,
    with the garbage collector still off (``Timer.time_call``). ``filler``: (fn, args) of the caller's heat, called back
    to back between timed calls (``Timer.fill``); the small blocks the burst will hold are made and freed before its
    first call (``Timer.reserve_small_blocks``: ``held``, what a call's inputs hold, if not the filler's arguments). The
    reference (in the judge) and the candidate (in its process) both go through it.

    After ``Timer.heat`` (the caller's, on other inputs), each call follows the previous one with only fillers, the
    idle probe, its inputs (made by the judge: they do not exist before the previous call has finished, so no
    candidate can work ahead on them; tests/cheats/work_ahead.py), the L2 flush and the launch cover in between, as
    FlashInfer-Bench (a synchronize between calls) and GPU MODE (fresh inputs between calls) time. The fillers keep a
    power-limited workload's GPU as loaded as back-to-back use would (docs/timing.md, "Fillers between timed calls").
    """
    if filler is not None:
        timer.reserve_small_blocks(filler[1] if held is None else held, count)
    gap_s, last_us = 0.0, 0.0
    for k in range(count):
        if filler is not None and k:
            timer.fill(*filler, gap_s, last_us)
        t0 = timer.perf()
        with timer.collector_off():  # from the probe to the output's copy: a collection would be timed, or charged
            probe = timer.before_call()
            fn, args = next_call(k)
            out, device_us, tail_us, host_us, launch_us = timer.time_call(fn, args)
            del fn, args
            deliver(k, out, [device_us, tail_us, probe, host_us, launch_us])
            del out
            if timer.hooks is not None:  # a thread of the candidate's may have installed one meanwhile
                timer.hooks.recheck(timer.gc_isenabled())
        last_us = device_us
        gap_s = max(0.0, timer.perf() - t0 - device_us * 1e-6)


def precise_enough(times: list[float], started_s: float, budget_s: float, now_s: float, min_runs: int = POLICY.min_runs,
                   limited: bool = False, sizes: list[int] | None = None, next_burst_s: float | None = None,
                   first_heat_s: float = 0.0) -> bool:
    """The adaptive stopping rule shared by reference and candidate timing; ``limited``: the workload is
    power-limited (POLICY.target_rse_limited); ``sizes``: the calls of each burst so far, in order (default: one burst);
    ``next_burst_s``: what one more burst would take, its heat included; ``first_heat_s``: the heat before the
    first burst.

    Stops at POLICY.max_runs calls, or from ``min_runs`` on once the mean's relative standard error is below its
    target or the budget is spent. A power-limited workload's burst means scatter more than its calls say, so it gets
    POLICY.limited_min_bursts bursts where they all fit in the budget (the first heat left out of that sum), and from
    two bursts on its error is the larger of the calls' and the burst means' standard error; where they do not fit,
    one precise burst ends its timing (docs/timing.md, "The stopping rule")."""
    n = len(times)
    if n >= POLICY.max_runs:
        return True
    if n < min_runs:
        return False
    sizes = sizes or [n]
    spent = now_s - started_s
    if limited and len(sizes) < POLICY.limited_min_bursts and next_burst_s is not None and (
            spent - first_heat_s + (POLICY.limited_min_bursts - len(sizes)) * next_burst_s <= budget_s):
        return False
    mean = sum(times) / n
    error = _standard_error(times)
    if limited and len(sizes) > 1:
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        means = [sum(times[start:start + size]) / size for start, size in zip(starts, sizes)]
        error = max(error, _standard_error(means))
    target = POLICY.target_rse_limited if limited else POLICY.target_rse
    if mean <= 0:  # calls below the clock's resolution: only the budget ends them
        return spent > budget_s
    return error / mean < target or spent > budget_s


def _standard_error(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))


class SideStreamRule:
    """Work a candidate leaves running on another stream finishes after its call's end event, so the device time
    misses it; its process measures each call's tail and idle probe (timer.Timer.time): tail minus probe is that work.

    Decided per burst, on the mean of tail minus probe over its calls (each at least 0), the largest left out: a
    burst whose figure exceeds max(escape_slack_us, 20% of its median call) left work running. The mean bounds what a
    burst can hide however it is spread over its calls; leaving the largest out keeps one honest call's long wake-up
    from deciding. The first MAX_DROPPED_BURSTS such bursts of a workload are dropped (their times not kept: a re-roll,
    worth at most the scatter between bursts) and timed again on fresh inputs; the next charges every call of the
    workload its whole tail, the probe not taken off (docs/timing.md, "What the judge checks")."""

    MAX_DROPPED_BURSTS = 2

    def __init__(self):
        self.dropped = 0  # bursts dropped so far
        self.charged = False
        self.extra_us = 0.0  # the figure of the last burst judged (the charged one, once charged)

    @staticmethod
    def figure(escapes: list[float]) -> float:
        """Mean tail minus probe (each at least 0; a probe read long must not offset another call's tail), the
        largest left out where there are three or more calls."""
        kept = sorted(max(0.0, e) for e in escapes)
        return statistics.fmean(kept[:-1] if len(kept) > 2 else kept)

    def verdict(self, times: list[float], escapes: list[float]) -> str:
        """For one burst (device us and tail minus probe, per call): "keep", "drop" (time it again) or "charge"
        (keep it; every call of the workload gets its whole tail)."""
        if self.charged:
            return "keep"
        extra = self.extra_us = self.figure(escapes)
        if extra <= max(POLICY.escape_slack_us, 0.2 * statistics.median(times)):
            return "keep"
        if self.dropped < self.MAX_DROPPED_BURSTS:
            self.dropped += 1
            return "drop"
        self.charged = True
        return "charge"

    def reported(self, times: list[float], tails: list[float]) -> list[float]:
        """The workload's times as the result reports them (and the stopping rule judges them)."""
        return [t + tail for t, tail in zip(times, tails)] if self.charged else times


def next_burst_s(burst_started: float, heat_s: float, limited: bool) -> float:
    """What one more burst of a workload would take: the one that began at ``burst_started`` (perf_counter), its
    ``heat_s`` of heat replaced by a later burst's (precise_enough)."""
    return time.perf_counter() - burst_started - heat_s + POLICY.later_heat_s(limited)


class Bursts:
    """What the stopping rule (precise_enough) knows of a workload's bursts so far: the kept ones' calls, the
    first one's heat and what one more would take."""

    def __init__(self):
        self.sizes: list[int] = []
        self.first_heat_s, self.next_s = 0.0, None

    def add(self, first: int, kept: int, burst_started: float, heat_s: float, limited: bool) -> None:
        """A burst done: ``first`` its first call's index (0: the workload's first burst), ``kept`` its calls in the
        result (0 for one the SideStreamRule dropped)."""
        if kept:
            self.sizes.append(kept)
        if first == 0:
            self.first_heat_s = heat_s
        self.next_s = next_burst_s(burst_started, heat_s, limited)

    def rule(self) -> tuple:
        """precise_enough's last arguments."""
        return self.sizes, self.next_s, self.first_heat_s


def burst_size(done: int, call_bytes: int, call_s: float, limited: bool, min_runs: int, budget_s: float,
           memory_bytes: int) -> int:
    """How many calls the next burst makes: POLICY.min_runs first, then twice as many as so far (fewer heats), within
    half the timing budget, the burst memory (inputs and output copies) and POLICY.max_runs kept calls in all
    (``done``: the calls kept so far; a burst the SideStreamRule dropped does not count; ``memory_bytes``: the burst
    memory, ``burst_memory_bytes``). Where the memory holds fewer than POLICY.min_runs calls, POLICY.min_runs are split
    into equal bursts (5 + 5 for a memory of 9 calls, not 9 + 9: the second burst would have made the calls up to
    POLICY.min_runs and as many again).

    A power-limited workload's bursts all make POLICY.min_runs calls: its calls speed up through a burst, so a longer
    burst would read faster and its mean would depend on how many bursts the stopping rule asked for (docs/timing.md,
    "The stopping rule")."""
    fits = max(1, memory_bytes // max(1, call_bytes))
    even = math.ceil(min_runs / math.ceil(min_runs / fits))  # POLICY.min_runs in the fewest bursts that fit
    size = even if done < min_runs or limited else max(min_runs, min(2 * done, int(
        budget_s / 2 / max(call_s, 1e-6))))
    return max(1, min(size, fits, POLICY.max_runs - done))



def burst_memory_bytes(device: str) -> int:
    """What a burst's inputs and output copies may hold: a POLICY.burst_memory_share of the GPU's memory, POLICY.burst_bytes_cpu
    on CPU."""
    if device == "cuda":
        return load_torch().cuda.get_device_properties(0).total_memory // POLICY.burst_memory_share
    return POLICY.burst_bytes_cpu


def honest_times(device: list[float], host: list[float]) -> tuple[list[float], bool]:
    """The device times of a workload's calls, or, where every one read 0 us (nothing ran between the call's
    events), the host times around the calls: (times, whether the host's)."""
    if device and len(host) == len(device) and max(device) <= 0.0:
        return list(host), True
    return device, False
