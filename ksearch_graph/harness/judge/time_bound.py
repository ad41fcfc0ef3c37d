"""The judge's own bound on a candidate's reported times: its clock around each timed call.

Each timed call begins when the judge sends its ``Go`` (the inputs exist only from then: the judge made them, in
memory it lends by descriptor, and flushed the L2 before) and ends when the judge holds its own copy of the output
the candidate's process said was ready (``Done``, then the judge's copy and, on a GPU, its synchronize). Nothing the
candidate's process does moves either end: work done before the ``Go`` has no inputs, work done after the copy
reaches nothing the judge compares. On a GPU the judge's interval is its host clock; on CPU, where a loaded host's
scheduler would stretch wall time, it is the CPU time of the candidate's whole process tree over that interval
(cgroup.py: every thread and process, exited ones included), which preemption does not stretch and forked workers
cannot escape.

What surrounds the call in that interval (``overhead``: the round trip, mapping the lent inputs, the launch cover's
hold, the synchronize, the copies of the output) is measured per evaluation, before any candidate code exists, by
calibration calls of a function that does nothing, made through the same path on the same inputs
(``Runner.calibrate``; ``calibrate`` here). A call's time is then at least ``device_floor_us`` (interval minus
overhead). A burst whose floor (a quantile of its calls') exceeds its median reported time by more than the slack
(``threshold_us``: ``bound_rel_slack`` of the call, ``bound_noise_spreads`` spreads of the overhead and
``bound_overhead_slack`` of the overhead itself), or whose floors' sum exceeds the reported sum by that slack per
call plus one stall, was timed by a forged clock (``contradiction``); the first such burst of a workload is dropped
and timed again, up to ``bound_max_dropped`` of them; one more fails the candidate (``ContradictionRule``).

How tight: a forger that controls its whole process can skip the launch cover's hold (POLICY.cover_s) and report
at best floor minus slack, so it gains at most about call / (call - hold - slack). The measured figures per call
length are in docs/threat-model.md ("The bound, by call length") and BENCHMARKS.md.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from ksearch_graph.harness.policy import POLICY


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


def overheads_us(spans_us: list[float], reported_us: list[float]) -> list[float]:
    """Per calibration call: the judge's interval minus what the call reported (a function that does nothing)."""
    return [span - max(0.0, us) for span, us in zip(spans_us, reported_us)]


def calibrate(overheads: list[float], cpu: bool = False) -> Calibration | None:
    """From the calibration calls' overheads (``overheads_us``; ``cpu``: CPU time of the candidate's tree, judged
    with the CPU's slack); None without samples."""
    if not overheads:
        return None
    ordered = sorted(overheads)
    median = statistics.median(ordered)
    high = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    noise = max(POLICY.bound_min_noise_us_cpu if cpu else POLICY.bound_min_noise_us, high - median)
    device = (POLICY.bound_rel_slack_cpu, POLICY.bound_quantile_cpu, POLICY.bound_overhead_slack_cpu) if cpu else (
        POLICY.bound_rel_slack, POLICY.bound_quantile, POLICY.bound_overhead_slack)
    return Calibration(median, noise, ordered[-1] - median, *device)


def pooled(calibrations: dict[str, Calibration | None], overheads: dict[str, list[float]]) -> dict:
    """Each workload's calibration with its spread widened to the spread of every calibration call of the evaluation
    (their 90th percentile minus their median), where that is larger. On a GPU host the steps around a call (mapping
    the lent memory, the round trip) drift by a few hundred us between one moment and the next, across workloads
    alike; eight calls of one workload see too little of that, and an honest call timed later would exceed its floor
    (docs/threat-model.md, "The bound, by call length")."""
    every = sorted(o for values in overheads.values() for o in values)
    if len(every) < 2:
        return dict(calibrations)
    spread = every[min(len(every) - 1, int(0.9 * len(every)))] - statistics.median(every)
    return {name: cal if cal is None or cal.noise_us >= spread else replace(cal, noise_us=spread)
            for name, cal in calibrations.items()}


def device_floor_us(interval_us: float, cal: Calibration) -> float:
    """The least time the judge's interval leaves for one call (fillers run outside it, between calls)."""
    return interval_us - cal.overhead_us


def slack_us(cal: Calibration) -> float:
    """What a call may report below the judge's floor besides ``cal.rel_slack`` of itself."""
    return POLICY.bound_noise_spreads * cal.noise_us + cal.overhead_slack * cal.overhead_us


def threshold_us(reported_us: float, cal: Calibration) -> float:
    """The largest floor (a burst's ``cal.quantile``) that a reported time (the burst's median) leaves unflagged."""
    return reported_us * (1 + cal.rel_slack) + slack_us(cal)


def least_credible_us(span_us: float, cal: Calibration | None) -> float:
    """The least time a call whose interval the judge measured as ``span_us`` may be counted at: what its floor
    leaves after the slack (the reported time ``threshold_us`` would still accept). A burst's rule judges its
    quantile and its sum; a forger that lies on a minority of calls passes both, so every kept call is counted at
    no less than this."""
    if cal is None:
        return 0.0
    return max(0.0, (device_floor_us(span_us, cal) - slack_us(cal)) / (1 + cal.rel_slack))


def contradiction(spans_us: list[float], reported_us: list[float], cal: Calibration | None) -> str | None:
    """Why the judge's clock contradicts a burst's reported device times (``spans_us``: the judge's interval per
    call, the last call's included), or None. Per call on a quantile of the floors (a collection or a preempted host
    lengthens a few intervals; a forged clock shortens every call), and on the whole burst (work moved into one
    call's interval)."""
    if cal is None or not reported_us or len(spans_us) != len(reported_us):
        return None
    floors = [device_floor_us(s, cal) for s in spans_us]
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


def trace_figures(spans_us: list[float], cal: Calibration | None, steps_us: list | None = None) -> dict | None:
    """A burst's figures for the timing trace (its key ``bound``; tools/forgery_check.py reads them back);
    ``steps_us``: per call, where in its interval the judge had written the inputs, flushed the L2 and had the
    answer."""
    return cal and {"spans_us": spans_us, "overhead_us": cal.overhead_us, "noise_us": cal.noise_us,
                    "rel_slack": cal.rel_slack, "quantile": cal.quantile, "overhead_slack": cal.overhead_slack,
                    "steps_us": steps_us or []}


class ContradictionRule:
    """Per workload: a burst the judge's clock contradicts is dropped and timed again, up to ``max_dropped`` of
    them (a host busy through a burst slows it; on a lent GPU host whole bursts stall by 1-3 ms a call now and
    then, docs/threat-model.md). A forged clock then lies again (one contradiction more fails), or backs off: the
    burst after a dropped one reports more than that one's median allows (``threshold_us`` of it), which fails too.
    Dropped bursts are in no result, so they buy a forger no lie beyond the slack."""

    def __init__(self, max_dropped: int = 1):
        self.max_dropped = max_dropped
        self.dropped: list[str] = []  # the dropped bursts' calls ("4-9")
        self.dropped_said_us = 0.0  # the last dropped burst's median reported time
        self.next_judged = True  # whether the burst after the last dropped one was judged against it

    def judge(self, spans_us: list[float], reported_us: list[float], cal: Calibration | None,
              calls: str) -> tuple[str, str]:
        """``verdict`` on one burst of the candidate's (``spans_us``: the judge's interval per call)."""
        return self.verdict(contradiction(spans_us, reported_us, cal), reported_us, cal, calls)

    def verdict(self, lie: str | None, reported_us: list[float], cal: Calibration | None,
                calls: str) -> tuple[str, str]:
        """("keep" | "drop" | "fail", why) for one burst (``lie``: ``contradiction``'s finding; ``calls``: its
        calls, as "4-9")."""
        if lie and len(self.dropped) >= self.max_dropped:
            return "fail", f"{lie}, as in calls {', '.join(self.dropped)} timed before them"
        if not self.next_judged and cal is not None and reported_us:
            self.next_judged = True
            said = statistics.median(reported_us)
            if said > threshold_us(self.dropped_said_us, cal):
                return "fail", (f"the candidate's process reported {said:.0f} us (median) for calls {calls}, after "
                                f"it had reported {self.dropped_said_us:.0f} us for calls {self.dropped[-1]}, which "
                                "the judge's clock contradicted")
        if lie:
            self.dropped.append(calls)
            self.dropped_said_us, self.next_judged = statistics.median(reported_us), False
            return "drop", f"calls {calls}: {lie}; dropped and timed again (a busy host?)"
        return "keep", ""
