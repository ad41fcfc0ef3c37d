"""The judge's own bound on a candidate's device time: its clock between the messages of a timed call.

The candidate's process asks the judge for each timed call's seed just before making its inputs, so the judge's clock
between two requests (``interval``) spans one whole timed call: the round trip, input generation, the launch cover,
the call, the synchronize, the output copy and fingerprint, the integrity check, and on a power-limited workload the
untimed fillers before the next call. The judge never runs candidate code, so nothing in the candidate's process can
shorten that interval. Whatever is not the call (``overhead``) is calibrated per evaluation from the reference's own
bursts, timed the same way in the judge (``reference_overheads``), plus what only the candidate's side does, measured
by the judge before any candidate code runs (the pipe's round trip, a fingerprint, an integrity check).

A call's device time is then at least ``device_floor_us``: interval minus overhead, minus the fillers the runner runs
by the rule (at most ``fill_max`` times the reported time, and up to ``bound_fill_overshoot`` more calls of the true
length still in flight when their time is up). A burst whose median floor exceeds its median reported time by more
than the slack below (``threshold_us``), or whose floors' sum exceeds the reported sum by that much per call plus one
stall (``bound_hiccup_us``: work a rewritten runner moved into one call's interval), was timed by a forged clock
(``contradiction``).

How tight (the constants are TimingPolicy's ``bound_*``; figures in docs/timing.md): the slack is
``bound_rel_slack`` of the call, plus ``bound_noise_spreads`` spreads of the overhead, plus ``bound_overhead_slack`` of
the overhead itself (the candidate's process may be slower at the same steps). A burst the judge's clock contradicts
is dropped and timed again, once per workload (``ContradictionRule``). A call much longer than that (a
millisecond on a GPU: TriMul, large matmuls) cannot report much less than itself; a call of tens of us hides inside
the overhead's spread, so only lies of more than that spread are caught. On a power-limited workload the fillers'
overshoot leaves the floor at ``1 / (1 + bound_fill_overshoot)`` of the call: only lies of more than ~4x are caught
there. On CPU the calls are host work, and a loaded host's scheduler delays a share of the hand-overs between the
processes by milliseconds: there the judge's interval leaves out the time either process waited on a run queue
(``call_spans_us``), a burst's floor is the lower quantile ``bound_quantile_cpu`` of its calls', and the slack
``bound_rel_slack_cpu`` of the call plus ``bound_overhead_slack_cpu`` of the overhead: a host's other work slows
each step around the call too (a busy SMT sibling, a calibration from a quieter minute), and no run queue shows it.
A lie is caught there where the call less twice its reported time exceeds the slack on the overhead (~3.5 ms on the
GPU MODE test task): gross lies on calls over ~4 ms, lies over 4x on calls over ~7 ms, over 2.5x over ~18 ms.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from .policy import POLICY
from .protocol import Ping, Pong


@dataclass(frozen=True)
class Calibration:
    """``overhead_us``: the host time of one timed call's steps besides the call itself (median); ``noise_us``: how
    far above the median it reaches (its 90th percentile minus the median, at least ``bound_min_noise_us``);
    ``worst_us``: the largest excess over the median the reference's calls showed; ``rel_slack``: the share of a call
    it may report below the floor, ``quantile``: which of a burst's floors is its floor, and ``overhead_slack``: the
    share of the overhead by which the candidate's side may be slower (``bound_rel_slack``, ``bound_quantile`` and
    ``bound_overhead_slack``; on CPU their ``_cpu`` forms)."""

    overhead_us: float
    noise_us: float
    worst_us: float = 0.0
    rel_slack: float = POLICY.bound_rel_slack
    quantile: float = POLICY.bound_quantile
    overhead_slack: float = POLICY.bound_overhead_slack


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values``, interpolated (0.5: the median)."""
    ordered = sorted(values)
    at = q * (len(ordered) - 1)
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def intervals_us(stamps_s: list[float]) -> list[float]:
    """The time between consecutive stamps (s), in us."""
    return [(b - a) * 1e6 for a, b in zip(stamps_s, stamps_s[1:])]


def run_queue_s(pid: int | str = "self") -> float:
    """How long a process's main thread has waited on a run queue so far (s; the kernel's schedstat), 0 where the
    kernel does not say."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[1]) * 1e-9
    except (OSError, ValueError, IndexError):
        return 0.0


def stamp(pid: int | None = None) -> tuple[float, float]:
    """A timed call's boundary as the judge sees it: (now, how long this process and, with ``pid``, the candidate's
    have waited on a run queue so far), in s."""
    return time.perf_counter(), run_queue_s() + (run_queue_s(pid) if pid is not None else 0.0)


def call_spans_us(stamps: list[tuple[float, float]]) -> list[float]:
    """The judge's interval per call from its ``stamp``s, less the time either process waited to run in it: a loaded
    host's scheduler, not the call (on CPU, where the calls are host work; docs/timing.md, "The judge's own
    bound")."""
    return [(b - a - (wb - wa)) * 1e6 for (a, wa), (b, wb) in zip(stamps, stamps[1:])]


def reference_overheads(stamps_s: list[float], device_us: list[float], fills_s: list[float]) -> list[float]:
    """Per timed call of a reference burst: the judge's interval around it (``stamps_s``: when each call's inputs
    were asked for, then when the burst ended) minus its device time and the fillers that ran in it (``fills_s``: the
    timer's fill total at the same stamps)."""
    spans = intervals_us(stamps_s)
    fills = intervals_us(fills_s)
    return [span - us - fill for span, us, fill in zip(spans, device_us, fills)]


def calibrate(overheads_us: list[float], extra_us: float, extra_noise_us: float = 0.0,
              cpu: bool = False) -> Calibration | None:
    """From the reference's per-call overheads and what the candidate's side adds (``extra_us``: round trip,
    fingerprint, integrity check; ``extra_noise_us``: how much the round trip varies, which the reference's calls do
    not show: a loaded host's scheduler delays each hand-over between the processes; ``cpu``: the calls are host
    work, judged with the CPU's slack); None without samples."""
    if not overheads_us:
        return None
    ordered = sorted(overheads_us)
    median = statistics.median(ordered)
    high = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    noise = max(POLICY.bound_min_noise_us, high - median) + extra_noise_us
    device = (POLICY.bound_rel_slack_cpu, POLICY.bound_quantile_cpu, POLICY.bound_overhead_slack_cpu) if cpu else (
        POLICY.bound_rel_slack, POLICY.bound_quantile, POLICY.bound_overhead_slack)
    return Calibration(median + extra_us, noise, ordered[-1] - median, *device)


def device_floor_us(interval_us: float, reported_us: float, cal: Calibration, limited: bool,
                    fill_max: float = POLICY.fill_max) -> float:
    """The least device time the judge's interval leaves for one call of a burst."""
    if not limited:
        return interval_us - cal.overhead_us
    return (interval_us - cal.overhead_us - fill_max * max(0.0, reported_us)) / (1 + POLICY.bound_fill_overshoot)


def slack_us(cal: Calibration) -> float:
    """What a call may report below the judge's floor besides ``cal.rel_slack`` of itself."""
    return POLICY.bound_noise_spreads * cal.noise_us + cal.overhead_slack * cal.overhead_us


def threshold_us(reported_us: float, cal: Calibration) -> float:
    """The largest floor (a burst's ``cal.quantile``) that a reported time (the burst's median) leaves unflagged."""
    return reported_us * (1 + cal.rel_slack) + slack_us(cal)


def contradiction(spans_us: list[float], reported_us: list[float], cal: Calibration | None, limited: bool,
                  fill_max: float = POLICY.fill_max) -> str | None:
    """Why the judge's clock contradicts a burst's reported device times (``spans_us``: the judge's interval per
    call, the last call's included), or None. Per call on a quantile of the floors (a collection or a preempted host
    lengthens a few intervals; a forged clock shortens every call), and on the whole burst (work moved into one
    call's interval)."""
    if cal is None or not reported_us or len(spans_us) != len(reported_us):
        return None
    floors = [device_floor_us(s, r, cal, limited, fill_max) for s, r in zip(spans_us, reported_us)]
    floor, said = quantile(floors, cal.quantile), statistics.median(reported_us)
    if floor > threshold_us(said, cal):
        return (f"the judge's clock leaves at least {floor:.0f} us of device time per call (the {cal.quantile:.0%} "
                f"quantile of its calls), the candidate's process reported {said:.0f} us (median)")
    total, told = sum(floors), sum(reported_us)
    stalls = cal.worst_us + POLICY.bound_hiccup_us
    if total > told * (1 + cal.rel_slack) + len(floors) * slack_us(cal) + stalls:
        return (f"the judge's clock leaves at least {total:.0f} us of device time for the burst's {len(floors)} calls, "
                f"the candidate's process reported {told:.0f} us")
    return None


def trace_figures(spans_us: list[float], cal: Calibration | None, limited: bool) -> dict | None:
    """A burst's figures for the timing trace (its key ``bound``; tools/forgery_check.py reads them back)."""
    return cal and {"spans_us": spans_us, "overhead_us": cal.overhead_us, "noise_us": cal.noise_us,
                    "rel_slack": cal.rel_slack, "quantile": cal.quantile, "overhead_slack": cal.overhead_slack,
                    "limited": limited}


class ContradictionRule:
    """Per workload: the first burst the judge's clock contradicts is dropped and timed again (a host busy through
    one burst slows it once). A forged clock then lies again (contradicted a second time), or backs off: the burst
    after the dropped one reports more than the dropped one's median allows (``threshold_us`` of it). Either fails
    the candidate, so the dropped burst buys a forger no lie beyond the slack."""

    def __init__(self):
        self.dropped = ""  # the dropped burst's calls ("4-9"), once one was dropped
        self.dropped_said_us = 0.0  # its median reported time
        self.next_judged = False

    def judge(self, spans_us: list[float], reported_us: list[float], cal: Calibration | None, limited: bool,
              calls: str) -> tuple[str, str]:
        """``verdict`` on one burst of the candidate's (``spans_us``: the judge's interval per call)."""
        return self.verdict(contradiction(spans_us, reported_us, cal, limited), reported_us, cal, calls)

    def verdict(self, lie: str | None, reported_us: list[float], cal: Calibration | None,
                calls: str) -> tuple[str, str]:
        """("keep" | "drop" | "fail", why) for one burst (``lie``: ``contradiction``'s finding; ``calls``: its
        calls, as "4-9")."""
        if lie and self.dropped:
            return "fail", f"{lie}, as in calls {self.dropped} timed before them"
        if lie:
            self.dropped, self.dropped_said_us = calls, statistics.median(reported_us)
            return "drop", f"calls {calls}: {lie}; dropped and timed again (a busy host?)"
        if self.dropped and not self.next_judged and cal is not None and reported_us:
            self.next_judged = True
            said = statistics.median(reported_us)
            if said > threshold_us(self.dropped_said_us, cal):
                return "fail", (f"the candidate's process reported {said:.0f} us (median) for calls {calls}, after "
                                f"it had reported {self.dropped_said_us:.0f} us for calls {self.dropped}, which the "
                                "judge's clock contradicted")
        return "keep", ""


def round_trip_us(runner, tries: int = 9) -> tuple[float, float]:
    """The pipe's round trip to the candidate's process (``runner``: runner_process.RunnerProcess), before any
    candidate code runs: (median, largest minus smallest) of ``tries``, in us."""
    trips = []
    for _ in range(tries):
        t0 = time.perf_counter()
        runner.request(Ping(), 30.0, "starting the candidate's process", expect=Pong)
        trips.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(trips), max(trips) - min(trips)

