"""The timing rules (harness/timing.py, timer.py) on CPU and with stand-ins: the side-stream rule, the judge's burst
loop, the stopping rule, burst sizes, the heat and its fillers, and the order of a timed call's steps; on a GPU, the
allocator during a burst and the heat's verdict through NVML."""

from __future__ import annotations

import json
import time

import pytest
import torch

from ksearch_graph.harness import _torch, reporting, timing
from ksearch_graph.harness.judge import candidate_calls
from ksearch_graph.harness.judge import evaluate as judge
from ksearch_graph.harness.policy import POLICY
from ksearch_graph.harness.timer import Timer

CUDA = torch.cuda.is_available()


def test_a_burst_that_leaves_work_running_is_timed_again_then_charged():
    """Side-stream work, judged per burst on the mean of tail minus probe, its largest call left out: a burst over
    max(10 us, 20% of its median call) is dropped (an honest host's wake-ups can read long for a whole burst), twice;
    the third charges the workload. One long call, or a tail within the slack, is kept; work hidden in a minority of
    calls is not."""

    from ksearch_graph.harness.timing import SideStreamRule

    call = [77.0] * 10
    honest = SideStreamRule()
    assert honest.verdict(call, [3.0] * 9 + [144.0]) == "keep"  # one long wake-up (a collection) is left out
    assert honest.verdict(call, [3.0] * 8 + [40.0] * 2) == "keep"  # (3 * 8 + 40) / 9 = 7.1 us
    assert honest.verdict(call, [POLICY.escape_slack_us + 5] * 10) == "keep"  # within 20% of a 77 us call (15.4 us)
    assert honest.verdict(call, [17.0] * 10) == "drop"  # session 15's honest burst
    assert honest.verdict(call, [2.0] * 10) == "keep" and not honest.charged  # timed again: clean
    assert honest.verdict(call, [-30.0] * 4 + [40.0] * 6) == "drop"  # a long probe offsets no other call's tail
    assert SideStreamRule().verdict([1000.0] * 10, [150.0] * 10) == "keep"  # 20% of the call is the slack
    assert SideStreamRule().verdict([5.0] * 10, [POLICY.escape_slack_us + 1] * 10) == "drop"  # 10 us at least
    assert SideStreamRule().verdict([77.0], [20.0]) == "drop"  # a burst of one call: its own figure

    cheat = SideStreamRule()
    some = [0.0] * 6 + [77.0] * 4  # work hidden in 4 calls of 10: the median (0) would not see it
    assert cheat.verdict(call, some) == "drop" and cheat.extra_us == pytest.approx(3 * 77 / 9)
    assert cheat.verdict(call, [2.0] * 10) == "keep"
    assert cheat.verdict(call, some) == "drop"
    assert cheat.verdict(call, some) == "charge" and cheat.charged and cheat.dropped == 2
    assert cheat.verdict(call, [2.0] * 10) == "keep" and cheat.extra_us == pytest.approx(3 * 77 / 9)
    assert cheat.reported([77.0, 5.0], [80.0, 3.0]) == [157.0, 8.0]  # charged: every call its whole tail
    assert honest.reported([77.0, 5.0], [80.0, 3.0]) == [77.0, 5.0]


FLAGS = {"reference_calls": 0, "power_limited": False, "heat_s": 0.0, "fill_s": 0.0, "interpreter_hooks": None,
         "library_patches": None, "persisting_l2_bytes": None, "harness_changed": None, "introspection": None}


class _StandInCalls:
    """Stands in for the judge's calls of the candidate's process (candidate_calls.CandidateCalls) in its timing
    loop (Judge.time_candidate): a warm-up, then bursts whose calls take each input set the judge makes and report
    the device times ``call_us(burst, call)``, long tails in the bursts ``long_tails``, and the flags: power_limited,
    and its heat as a running total, ``first_heat_s`` spent (slept) in the first burst, plus ``claimed_heat_s`` per
    burst that it only says it spent. Its outputs are its inputs (the bare judge's reference)."""

    def __init__(self, long_tails=(), call_us=lambda burst, call: 77.0 + burst, limited=False,
                 first_heat_s=0.0, claimed_heat_s=0.0):
        self.long_tails, self.call_us, self.limited = set(long_tails), call_us, limited
        self.first_heat_s, self.claimed_heat_s, self.heat_s = first_heat_s, claimed_heat_s, 0.0
        self.bursts, self.seeds = [], []

    def warm(self, workload, inputs, timeout_s, where):
        return 1e-4

    def burst(self, workload, heat_inputs, make_inputs, count, first, deadline, where):
        k = len(self.bursts)
        self.bursts.append(count)
        if k == 0:
            time.sleep(self.first_heat_s)
            self.heat_s += self.first_heat_s
        self.heat_s += self.claimed_heat_s
        tail = 60.0 if k in self.long_tails else 3.0
        calls = []
        for i in range(count):
            out = make_inputs(i)[0]
            self.seeds.append(float(out[0]))
            us = float(self.call_us(k, i))
            calls.append(candidate_calls.TimedCall([us, tail, 1.0, 2e5, 5.0, 2e5], us, out, [0.0, 0.0, us]))
        return calls, None, FLAGS | {"power_limited": self.limited, "heat_s": self.heat_s}


def _bare_judge(budget_s: float = 0.0, trace_path: str | None = None):
    """A Judge with only what its timing loop needs (no processes, no task): inputs are one tensor from the seed, the
    reference returns it, and every check passes. ``budget_s``: 0 stops at min_runs where the rule allows."""
    import random
    from types import SimpleNamespace

    j = judge.Judge.__new__(judge.Judge)
    j.min_runs, j.base_seed, j.rng, j.device = 10, 12345, random.Random(0), "cpu"
    j.args = SimpleNamespace(time_budget_s=budget_s, call_timeout_s=30.0)
    j.call_bytes, j.power_limited, j.timing_trace = {"w": 1 << 10}, {}, reporting.TimingTrace(trace_path)
    j.calibrations = {}  # time_bound.py's calibration: none, so no bound is judged here
    j.device_floor_us, j.ref_timing = {}, {}  # nor the repeated-input check's floor and reference figures
    j.phases = {"timing_heat": 0.0, "timing_fill": 0.0, "reference": 0.0, "checks": 0.0}
    j.inputs = lambda w, seed: [torch.full((4,), float(seed % 1000))]
    j.reference = lambda inputs: inputs[0]
    j.check = lambda *a, **k: (0.0, 0.0)
    return j


def _time(judge_, calls, w):
    judge_.calls = calls
    return judge_.time_candidate(w)


def test_the_judge_drops_a_flagged_burst_times_fresh_inputs_and_charges_the_third(tmp_path):
    """The judge's timing loop with a stand-in for the candidate's process that reports long tails in chosen bursts:
    a dropped burst's calls are not in the result, every burst gets seeds of its own, the trace marks the dropped
    ones, and a third flagged burst charges every kept call its tail."""

    w = {"name": "w", "params": {}}
    trace = tmp_path / "trace.jsonl"
    # The first burst reads long tails: dropped, timed again on fresh seeds, clean.
    runner = _StandInCalls(long_tails={0})
    times, notes = _time(_bare_judge(trace_path=str(trace)), runner, w)
    assert times == [78.0] * 10  # the second burst's calls only, without their tails
    assert len(runner.bursts) == 2 and len(set(runner.seeds)) == 20  # no input set twice
    assert len(notes) == 1 and "calls 1-10" in notes[0] and "dropped and timed again" in notes[0]
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [(line["first"], line.get("dropped", False)) for line in lines] == [(0, True), (10, False)]

    # Three flagged bursts in a row: two dropped, the third charged and kept with its tails.
    runner = _StandInCalls(long_tails={0, 1, 2})
    times, notes = _time(_bare_judge(), runner, w)
    assert len(runner.bursts) == 3 and len(set(runner.seeds)) == 30
    assert times == [79.0 + 60.0] * 10
    assert "every call timed until the whole device was idle" in notes[-1] and "2 dropped" in notes[-1]


def test_a_power_limited_workload_gets_three_bursts_where_they_fit_and_is_judged_on_their_means():
    """Under the power cap a burst's calls share its clock state, so one burst cannot say how far the next would
    read: the judge times a power-limited workload in LIMITED_MIN_BURSTS bursts when they fit in the budget (its
    first heat not counted in that sum), not where they do not, and once it has two or more, it goes on while their
    means disagree (within the budget). What the candidate's process says its heat took counts only as far as this
    side saw the time pass."""

    w = {"name": "w", "params": {}}
    steady = lambda burst, call: 100.0 + 0.1 * (call % 2)  # noqa: E731  (each burst's calls agree to 0.05%)
    # Cheap bursts (a later one costs its 0.2 s heat): three.
    runner = _StandInCalls(call_us=steady, limited=True)
    times, _ = _time(_bare_judge(budget_s=0.6), runner, w)
    assert len(runner.bursts) == POLICY.limited_min_bursts == 3 and len(times) == 30
    # A budget that two more bursts' heats overrun: one burst, judged on its calls as before.
    runner = _StandInCalls(call_us=steady, limited=True)
    times, _ = _time(_bare_judge(budget_s=0.3), runner, w)
    assert len(runner.bursts) == 1
    # A first heat of 0.35 s is left out of the sum (0.35 + 0.4 > 0.6, but 0.4 fits): three.
    runner = _StandInCalls(call_us=steady, limited=True, first_heat_s=0.35)
    _time(_bare_judge(budget_s=0.6), runner, w)
    assert len(runner.bursts) == 3
    # A process that says each heat took 100 s, having spent none: no room made by it.
    runner = _StandInCalls(call_us=steady, limited=True, claimed_heat_s=100.0)
    _time(_bare_judge(budget_s=0.3), runner, w)
    assert len(runner.bursts) == 1
    # Not power-limited: one burst whose calls agree is enough, however cheap more would be.
    runner = _StandInCalls(call_us=steady)
    _time(_bare_judge(budget_s=10.0), runner, w)
    assert len(runner.bursts) == 1
    # Bursts whose means disagree by 4% (each burst steady): on until the budget is spent or MAX_RUNS.
    runner = _StandInCalls(call_us=lambda burst, call: 100.0 + 4.0 * (burst % 2), limited=True)
    times, _ = _time(_bare_judge(budget_s=10.0), runner, w)
    assert len(times) == POLICY.max_runs


def test_a_later_burst_is_priced_with_a_later_bursts_heat():
    """What one more burst costs: the last one's time with its heat (a first heat runs until the calls stop slowing,
    up to 0.5 s) replaced by a later burst's."""

    now = time.perf_counter()
    assert timing.next_burst_s(now - 0.6, 0.5, limited=True) == pytest.approx(0.1 + POLICY.heat_min_s, abs=0.05)
    assert timing.next_burst_s(now - 0.3, 0.2, limited=False) == pytest.approx(0.1 + POLICY.heat_s, abs=0.05)


def test_timing_stops_on_burst_means_for_a_power_limited_workload():
    """The stopping rule itself: bursts whose calls agree but whose means do not are not precise for a power-limited
    workload (they would be for another); three bursts are asked for only while they fit in the budget."""

    apart = [100.0] * 10 + [104.0] * 10 + [100.0] * 10  # three steady bursts, means 4% apart
    assert timing.precise_enough(apart, 0.0, 1.0, 0.1, sizes=[30])  # as one burst of calls (1.8% each): 0.34%
    assert not timing.precise_enough(apart, 0.0, 1.0, 0.1, limited=True, sizes=[10, 10, 10])  # 1.3% between bursts
    assert timing.precise_enough(apart, 0.0, 1.0, 1.1, limited=True, sizes=[10, 10, 10])  # the budget is spent
    steady = [100.0, 100.2] * 5
    assert not timing.precise_enough(steady, 0.0, 1.0, 0.1, limited=True, sizes=[10], next_burst_s=0.3)  # 0.1 + 0.6 fit
    assert timing.precise_enough(steady, 0.0, 1.0, 0.5, limited=True, sizes=[10], next_burst_s=0.3)  # 0.5 + 0.6 do not
    assert timing.precise_enough(steady, 0.0, 1.0, 0.1, sizes=[10], next_burst_s=0.3)  # not limited: one burst
    # A first heat of 0.45 s does not decide whether three fit (0.7 - 0.45 + 0.4 do); the budget still counts it.
    assert timing.precise_enough(steady, 0.0, 1.0, 0.7, limited=True, sizes=[10], next_burst_s=0.2)
    assert not timing.precise_enough(steady, 0.0, 1.0, 0.7, limited=True, sizes=[10], next_burst_s=0.2, first_heat_s=0.45)
    noisy = [100.0, 106.0] * 5  # 1% relative standard error: on until the budget is spent, its heat included
    assert timing.precise_enough(noisy, 0.0, 1.0, 1.1, limited=True, sizes=[10], next_burst_s=0.6, first_heat_s=0.45)
    # Two bursts whose means agree by chance: the calls' own error (1%) still decides.
    assert not timing.precise_enough(noisy * 2, 0.0, 1.0, 0.5, limited=True, sizes=[10, 10])
    assert timing.precise_enough(steady * 2, 0.0, 1.0, 0.5, limited=True, sizes=[10, 10])


def test_timing_bursts_grow_within_memory_budget_and_run_limits():
    """Timed calls run in bursts on inputs generated beforehand: MIN_RUNS first, then twice what was done, within
    half the time budget, the burst memory and MAX_RUNS; a workload too big for the burst memory goes one call at a
    time."""
    from types import SimpleNamespace


    j = judge.Judge.__new__(judge.Judge)  # only the sizing rule: no processes
    j.min_runs, j.args, j.device = POLICY.min_runs, SimpleNamespace(time_budget_s=1.0), "cpu"
    small = 1 << 20
    assert j.burst_size(0, small, 1e-3) == POLICY.min_runs
    assert j.burst_size(3, small, 1e-3) == 6 and j.burst_size(24, small, 1e-3) == 48
    assert j.burst_size(96, small, 1e-6) == POLICY.max_runs - 96  # never past MAX_RUNS in all
    assert j.burst_size(3, small, 0.2) == POLICY.min_runs  # 0.5 s of budget fits 2 calls: MIN_RUNS still
    # A power-limited workload: every burst the same length (a longer one reads faster under the cap).
    assert j.burst_size(3, small, 1e-3, limited=True) == j.burst_size(24, small, 1e-3, limited=True) == POLICY.min_runs
    assert j.burst_size(0, POLICY.burst_bytes_cpu // 2, 1e-3, limited=True) == 2  # the memory cap still
    assert j.burst_size(0, POLICY.burst_bytes_cpu // 2, 1e-3) == 2  # the memory cap
    assert j.burst_size(0, POLICY.burst_bytes_cpu * 3, 1e-3) == 1  # bigger than the cap: one call at a time
    # A memory that holds fewer than MIN_RUNS calls: MIN_RUNS in equal bursts (then a power-limited workload's bursts
    # stay that size; another's grow).
    j.min_runs = 10
    nine = POLICY.burst_bytes_cpu // 9
    assert j.burst_size(0, nine, 1e-3) == j.burst_size(5, nine, 1e-3) == 5
    assert j.burst_size(10, nine, 1e-3, limited=True) == 5 and j.burst_size(10, nine, 1e-3) == 9
    assert j.burst_size(0, POLICY.burst_bytes_cpu // 3, 1e-3) == 3  # 3 + 3 + 3 + 3: 4 bursts either way
    assert j.burst_size(0, POLICY.burst_bytes_cpu // 4, 1e-3) == 4  # 4 + 4 + 4
    # On a GPU the burst memory is an eighth of the device's, with no ceiling (an H200's 139 GiB: 17.4 GiB).
    h200 = (139 << 30) // POLICY.burst_memory_share
    assert POLICY.burst_memory_share == 8
    assert timing.burst_size(0, 2 << 30, 1e-3, False, 10, 1.0, h200) == 5  # 8 calls fit: 5 + 5
    assert timing.burst_size(0, (139 << 30) // 8 // 10, 1e-3, False, 10, 1.0, h200) == 10  # exactly 10 fit


def test_timing_stops_at_a_tighter_error_for_a_power_limited_workload():
    """A power-limited kernel's calls vary more: its timing goes on until the mean's relative standard error is below
    TARGET_RSE_LIMITED, not TARGET_RSE; the budget stops both."""

    assert POLICY.target_rse_limited < POLICY.target_rse
    times = [100.0, 103.0] * 8  # 16 calls, relative standard error 0.38% (1.5% per call)
    noisy = [100.0, 106.0] * 8  # 0.77%
    assert timing.precise_enough(times, 0.0, 1.0, 0.1) and timing.precise_enough(times, 0.0, 1.0, 0.1, limited=True)
    assert timing.precise_enough(noisy, 0.0, 1.0, 0.1) and not timing.precise_enough(noisy, 0.0, 1.0, 0.1, limited=True)
    assert timing.precise_enough(noisy, 0.0, 1.0, 1.1, limited=True)  # the budget is spent


def test_heat_lasts_until_the_calls_stop_slowing_and_fillers_keep_a_power_limited_gpu_busy():
    """The rules that keep a GPU under sustained load around timed calls (the calls themselves run only on a GPU;
    here a fake clock, scripted call times and scripted NVML readings stand in for them)."""
    from types import SimpleNamespace


    _torch.load_torch()
    timer = Timer("cpu")
    timer.cuda = True  # the rules below only run on a GPU
    clock, script, asked, nvml = [0.0], [], [], SimpleNamespace(available=True)

    def back_to_back(fn, args, seconds, min_calls=1, while_busy=None):
        asked.append(seconds)
        clock[0] += seconds
        timer.untimed_us.append(script.pop(0) if script else 100.0)
        if while_busy is not None:  # NVML is read while the calls run
            while_busy()

    def heat(first=True, times=(), limited=True, stale_windows=0, held=None, power=True, first_change=False,
             period=1, failed=(), near=True):
        """Seconds the heat took. NVML's power reading stays what it was before the heat for ``stale_windows``
        windows, then changes every ``period`` reads (one a window; on an H200 it is refreshed about every 4);
        ``limited``: whether the changed readings are at the power limit (None: the reading never changes);
        ``first_change``: whether the first changed one is (it may cover the previous workload); ``held``: what
        the clock and its reasons say (default: as ``limited``); ``power``: whether the driver has a power
        reading at all; ``failed``: the reads whose power query fails; ``near``: whether the changed readings are
        within SLOWDOWN_POWER of the limit (where a slowdown may be the cap's)."""
        clock[0], script[:], reads = 0.0, list(times), [0]
        clock_held = bool(limited) if held is None else held

        def read():
            k = reads[0]  # 0: the read before the heat's calls
            reads[0] += 1
            if not power or k in failed:
                return clock_held, None
            if limited is None or k <= stale_windows:
                return clock_held, 100.0
            return clock_held, 200.0 + (k - stale_windows - 1) // period + 1

        nvml.read, nvml.has_power = read, power
        nvml.at_limit = lambda w, share=POLICY.power_limited: (bool(limited) and w > 200.0) or (
            first_change and w == 201.0) or (share < POLICY.power_limited and near and w > 200.0)
        timer.heat(None, (), first=first)
        return clock[0]

    timer.perf = lambda: clock[0]
    timer.back_to_back = back_to_back
    timer.gauge = nvml
    window = POLICY.heat_window_s
    # A process's first heat, power-limited: at least FIRST_HEAT_MIN_S however flat (a cool GPU throttles late).
    assert POLICY.first_heat_min_s <= heat() <= POLICY.first_heat_min_s + 2 * window and timer.limited
    # A later workload, power-limited: at least HEAT_MIN_S, then until a window is no slower than the one before.
    rising = round(POLICY.heat_min_s / window) + 2  # windows still slowing down after HEAT_MIN_S
    assert heat(times=[100 + 4 * i for i in range(rising)] + [100 + 4 * rising - 3.5]) == pytest.approx(
        (rising + 1) * window)
    assert POLICY.heat_max_s <= heat(times=[100 + 5 * i for i in range(100)]) <= POLICY.heat_max_s + window
    # Not power-limited: a few windows; no fillers afterwards.
    assert heat(limited=False) == pytest.approx(POLICY.unlimited_heat_windows[0] * window) and not timer.limited
    asked.clear()
    timer.fill(None, (), gap_s=1e-3, call_us=1000.0)
    assert asked == []
    # NVML at top clock, but the calls keep slowing down under their own load, by more than LOAD_SLOWDOWN after the
    # first window: limited too (a heat ends after two windows only if the second is no slower than the first).
    assert heat(times=[95.0, 97.0, 99.0, 101.0], limited=False) >= POLICY.heat_min_s and timer.limited
    assert timer.limited_by == "slowdown"
    assert heat(times=[95.0, 97.0, 98.0, 98.5], limited=False) < POLICY.heat_min_s and not timer.limited
    # The same slowdown with the power far below the cap (a few-us kernel's windows move by 3% without it, session
    # 10): not limited. Without a power reading in the driver, the slowdown decides.
    assert heat(times=[95.0, 97.0, 99.0, 101.0], limited=False, near=False) < POLICY.heat_min_s
    assert not timer.limited and timer.limited_by is None
    assert heat(times=[95.0, 97.0, 99.0, 101.0], limited=False, held=False, power=False) >= POLICY.heat_min_s
    assert timer.limited_by == "slowdown"
    # Only the readings that count say how near the cap the GPU is: a first refresh near it (it may cover the previous
    # workload) does not make a slowdown count; a slowdown before the first counted reading counts once one is near.
    assert heat(times=[95.0, 97.0, 99.0, 101.0], limited=False, near=False, first_change=True, period=4) < POLICY.heat_min_s
    assert not timer.limited
    slowing = [95.0, 97.0, 99.0, 101.0] + [101.0] * 4
    assert heat(times=slowing, limited=False, stale_windows=5) >= POLICY.heat_min_s and timer.limited_by == "slowdown"
    assert heat(times=slowing, limited=False, stale_windows=5, near=False) < POLICY.heat_min_s and not timer.limited
    # Not limited, but NVML's power reading stays what it was before the heat for 5 windows: the heat waits for one
    # from within the heat (its second change: the seventh window's).
    assert heat(limited=False, stale_windows=5) == pytest.approx(7 * window) and not timer.limited
    # Power at the limit only in the first changed reading (which may cover the previous workload): not counted,
    # however many windows read it before the next refresh (the fifth window's, with one every 4 reads).
    assert heat(limited=False, first_change=True) == pytest.approx(2 * window) and not timer.limited
    assert heat(limited=False, first_change=True, period=4) == pytest.approx(5 * window) and not timer.limited
    # The clock held below top (it lags: the previous workload's cap) but fresh power readings well below the limit:
    # not limited. Without a power reading in the driver, the clock decides.
    assert heat(limited=False, held=True) == pytest.approx(POLICY.unlimited_heat_windows[0] * window)
    assert not timer.limited
    assert heat(limited=False, held=True, power=False) >= POLICY.heat_min_s and timer.limited
    # A power query that fails now and then (the driver has the field): those windows are skipped, the clock is not
    # asked instead.
    assert heat(limited=False, held=True, failed={1, 2}, stale_windows=2) == pytest.approx(4 * window)
    assert not timer.limited
    assert heat(limited=False, power=False) == pytest.approx(POLICY.unlimited_heat_windows[0] * window)
    assert not timer.limited
    # Clock at top, but a fresh power reading at the limit: limited (it reads early, before the clock drops).
    assert heat(limited=True, held=False) >= POLICY.heat_min_s and timer.limited and timer.limited_by == "power"
    # No fresh reading within HEAT_MAX_S, or no NVML at all: the safe side, power-limited.
    assert heat(limited=None) >= POLICY.heat_max_s and timer.limited and timer.limited_by == "no power reading"
    nvml.available = False
    assert heat(limited=False) >= POLICY.heat_min_s and timer.limited and timer.limited_by == "no NVML"
    nvml.available = True
    asked.clear()
    timer.heat(None, (), first=False)  # a later burst of the same workload, power-limited: the GPU idled meanwhile
    assert asked == [POLICY.heat_min_s] and timer.limited
    timer.limited = False
    asked.clear()
    timer.heat(None, (), first=False)  # not power-limited: a short heat
    assert asked == [POLICY.heat_s] and not timer.limited
    timer.limited = True
    # Fillers: enough that calls fill FILL_DUTY of the time, at most FILL_MAX x the timed call.
    asked.clear()
    timer.fill(None, (), gap_s=0.0, call_us=100.0)  # nothing else between calls: no fillers
    timer.fill(None, (), gap_s=50e-6, call_us=1000.0)
    assert asked == []
    timer.fill(None, (), gap_s=1e-3, call_us=1000.0)
    want = min(POLICY.fill_duty / (1 - POLICY.fill_duty) * 1e-3 - 1e-3, POLICY.fill_max * 1e-3)
    assert asked == [pytest.approx(want)] and want > 0
    # A fresh process's first heat, not power-limited: more windows than later ones (the GPU may be cool).
    timer.heated = False
    assert heat(limited=False) == pytest.approx(POLICY.unlimited_heat_windows[1] * window)


def test_a_timed_call_follows_the_probe_and_the_launch_cover_and_fillers_run_before_the_next_inputs_exist():
    """The order that keeps the checks sound: the idle-device probe, then the call's inputs (the judge makes them
    only now, and flushes the L2), then the launch cover's hold, then the call, then the output's copy; untimed calls
    of the candidate (fillers) before the next call's inputs are made, so its code never runs while they exist
    (tests/cheats/work_ahead.py). Fake CUDA calls log the order."""

    _torch.load_torch()
    timer = Timer("cpu")
    timer.cuda, timer.runtime, log = True, None, []
    timer.idle_gap_us = lambda: log.append("probe") or 0.0
    timer.cover = lambda: log.append("cover")
    timer.Event = lambda enable_timing=False: object()
    timer.record = timer.event_sync = lambda event: None
    timer.sync = lambda: log.append("sync")
    timer.elapsed = lambda a, b: 0.01
    timer.fill = lambda fn, args, gap_s, call_us: log.append("fill")
    timer.reserve_small_blocks = lambda held, count: log.append(f"reserve {count} x {held}")

    def next_call(k):
        log.append(f"inputs {k}")
        return (lambda: log.append("call")), ()

    timing.timed_burst(timer, 2, next_call, lambda k, out, times: log.append(f"copy {k}"),
                       filler=(None, ("heat args",)))
    assert log == ["reserve 2 x ('heat args',)", "probe", "probe", "inputs 0", "cover", "call", "sync", "copy 0",
                   "fill", "probe", "probe", "inputs 1", "cover", "call", "sync", "copy 1"]
    log.clear()  # a module task's call holds its whole inputs (the state dict too), not only the forward arguments
    timing.timed_burst(timer, 1, next_call, lambda k, out, times: None, filler=(None, ("forward",)),
                       held=("init", {"w": 1}, "forward"))
    assert log[0] == "reserve 1 x ('init', {'w': 1}, 'forward')"


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_no_call_of_a_burst_gets_a_segment_from_the_driver():
    """A burst holds every call's inputs and output copy for the judge's checks, so torch's caching allocator ran out
    of small blocks about once a burst, and the candidate's output came from a cudaMalloc inside its timed call,
    which waits for the launch cover (a 32 us matmul read ~300 us, session 12). Timer.reserve_small_blocks makes the
    burst's small blocks before its first call: no call after the heat, timed or filler, needs a new segment."""

    torch = _torch.load_torch()
    if torch.cuda.get_allocator_backend() != "native":
        pytest.skip("counts the native caching allocator's segments")
    timer = Timer("cuda")
    w = torch.randn(4096, 2048, device="cuda")
    new_segments = []

    def call(x):  # the cheat task's skinny workload: 16x4096 @ 4096x2048, a 128 KB output
        before = torch.cuda.memory_stats()["num_device_alloc"]
        out = torch.relu(x @ w)
        new_segments.append(torch.cuda.memory_stats()["num_device_alloc"] - before)
        return out

    heat_args = (torch.randn(16, 4096, device="cuda"),)
    timer.heat(call, heat_args, True)
    new_segments.clear()
    done = timing.timed_burst(timer, 40, lambda k: (call, (torch.randn(16, 4096, device="cuda"),)),
                          filler=(call, heat_args))
    assert len(done) == 40 and all(isinstance(out, torch.Tensor) for out, *_ in done)
    assert len(new_segments) >= 40 and sum(new_segments) == 0, new_segments


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_the_heat_tells_a_power_limited_kernel_from_a_light_one_through_nvml():
    """NVML through the driver's library (clock, clock-event reasons, instantaneous power): small multiplies back to
    back leave the GPU far below its power limit; an 8192^3 bf16 matmul drives an H200 past it (792-872 W of 700 in
    session 8) before its clock drops; a 256M fp32 scale (about 560 W) does not."""

    _torch.load_torch()
    timer = Timer("cuda")
    gauge = timer.gauge
    assert gauge is not None and gauge.available and gauge.top > 0, "NVML is not reachable: every kernel gets fillers"
    small = torch.ones(1 << 16, device="cuda")
    timer.heat(lambda x: x * 2, (small,), first=True)
    assert not timer.limited, (f"a light kernel read as power-limited by {timer.limited_by} (top clock {gauge.top} "
                               f"MHz; windows as call us, clock held, W: {timer.heat_trace})")
    if "H200" not in torch.cuda.get_device_name():  # the figures below are an H200's (700 W)
        return
    assert gauge.power() is not None and gauge.limit_mw > 0, "the driver has no instantaneous power reading"
    heats = {}
    g = torch.Generator(device="cuda").manual_seed(0)
    for name, fn, args in [("scale 256M fp32", torch.mul, (torch.randn(1 << 28, generator=g, device="cuda"), 1.5)),
                           ("matmul 8192 bf16", torch.matmul, (torch.randn(8192, 8192, generator=g, device="cuda",
                                                                           dtype=torch.bfloat16),) * 2)]:
        t0 = time.perf_counter()
        timer.heat(fn, args, first=True)
        heats[name] = (timer.limited, time.perf_counter() - t0, gauge.power())
        time.sleep(0.3)  # cool down between them
    assert heats["matmul 8192 bf16"][0], f"an 8192^3 bf16 matmul back to back read as not limited: {heats}"
    # Memory-bound, about 560 W: not limited, told by a refreshed power reading (a heat without one runs to
    # HEAT_MAX_S and counts as limited).
    assert not heats["scale 256M fp32"][0], f"a 256M fp32 scale back to back read as power-limited: {heats}"
    assert heats["scale 256M fp32"][1] < POLICY.heat_max_s, f"no refreshed power reading in the heat: {heats}"
