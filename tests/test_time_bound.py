"""harness/judge/time_bound.py: the judge's own bound on a candidate's device time, on figures shaped like real bursts."""

import pytest

from ksearch_graph.harness.judge import time_bound as tb
from ksearch_graph.harness.policy import POLICY
from ksearch_graph.harness.reporting import TimingTrace


def test_calibration_overheads_are_the_interval_less_what_the_do_nothing_call_reported():
    assert tb.overheads_us([180.0, 200.0], [6.0, -1.0]) == pytest.approx([174.0, 200.0])


def test_calibration_reads_the_spread_from_the_tail():
    cal = tb.calibrate([500.0] * 9 + [5000.0])
    assert cal.overhead_us == pytest.approx(500.0)
    assert cal.noise_us == pytest.approx(4500.0)  # the 90th percentile is the slow call
    assert tb.calibrate([500.0, 510.0, 505.0]).noise_us == POLICY.bound_min_noise_us
    assert tb.calibrate([500.0, 510.0, 505.0], cpu=True).noise_us == POLICY.bound_min_noise_us_cpu
    assert tb.calibrate([]) is None


def burst(true_us: float, said_us: float, overhead_us: float = 600.0, calls: int = 10) -> tuple:
    return [overhead_us + true_us] * calls, [said_us] * calls


CAL = tb.Calibration(overhead_us=600.0, noise_us=30.0)


@pytest.mark.parametrize("true_us", [5.0, 50.0, 800.0, 8000.0])
def test_an_honest_burst_is_never_contradicted(true_us):
    spans, said = burst(true_us, true_us)
    assert tb.contradiction(spans, said, CAL) is None
    spans = [s + 0.1 * 600.0 for s in spans]  # the steps around the call 10% slower than calibrated
    assert tb.contradiction(spans, said, CAL) is None


def test_a_long_call_cannot_report_much_less_than_it_took():
    spans, said = burst(8000.0, 6000.0)  # 25% under: caught
    assert "judge's clock" in tb.contradiction(spans, said, CAL)
    spans, said = burst(8000.0, 7400.0)  # 7.5% under: within the slack
    assert tb.contradiction(spans, said, CAL) is None


def test_a_short_call_hides_in_the_overheads_spread_but_not_a_gross_lie():
    spans, said = burst(20.0, 10.0)
    assert tb.contradiction(spans, said, CAL) is None
    spans, said = burst(8189.0, 1.0)  # a protocol takeover's figures on TriMul
    assert tb.contradiction(spans, said, CAL) is not None


def test_a_collection_in_one_call_does_not_decide():
    spans, said = burst(300.0, 300.0)
    spans[3] += 20000.0
    assert tb.contradiction(spans, said, CAL) is None


def test_work_moved_into_one_calls_interval_is_caught_on_the_whole_burst():
    spans, said = burst(1.0, 1.0, calls=10)
    spans[-1] += 10 * 8000.0  # every call's work done at the end
    assert "burst's 10 calls" in tb.contradiction(spans, said, CAL)


@pytest.mark.parametrize("call_us, goal", [(100.0, 2.0), (1000.0, 1.5)])
def test_a_forger_that_skips_the_cover_and_lies_gains_within_the_goal_on_a_gpu(call_us, goal):
    """The GPU rule on a quiet host's calibration (overhead ~100 us, spread at the floor): a forger that controls its
    whole process saves the launch cover's hold and reports the least that passes."""
    cal = tb.calibrate([100.0, 101.0, 99.0, 100.0, 102.0, 100.0, 98.0, 100.0])
    spans = [cal.overhead_us - POLICY.cover_s * 1e6 + call_us] * 10
    least = min(r for r in (call_us * f / 1000 for f in range(1, 1001)) if tb.contradiction(spans, [r] * 10, cal) is None)
    assert call_us / least <= goal, (call_us, least)


def test_without_calibration_nothing_is_judged():
    assert tb.contradiction([1e6], [1.0], None) is None


def test_on_cpu_the_slack_covers_the_steps_around_a_call_run_slower_but_not_a_forged_clock():
    cpu = tb.calibrate([180.0] * 20, cpu=True)
    assert (cpu.rel_slack, cpu.quantile) == (POLICY.bound_rel_slack_cpu, POLICY.bound_quantile_cpu)
    # An honest 2.5 ms call (the softmax seed under the Triton interpreter on a two-core host): its tree's CPU time
    # is the call's plus the steps around it, which a busy SMT sibling slows by half.
    spans = [1.5 * 180.0 + 2500.0] * 12
    assert tb.contradiction(spans, [2500.0] * 12, cpu) is None
    # A clock forged to read a tenth, on every call: caught.
    assert "quantile" in tb.contradiction(spans, [250.0] * 12, cpu)
    # A clock forged to a thousandth on an 80 ms call (tests/cheats/forge_blind_guard.py).
    assert tb.contradiction([180.0 + 80_000.0] * 6, [80.0] * 6, cpu) is not None


def test_quantile_interpolates_and_its_half_is_the_median():
    assert tb.quantile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert tb.quantile([4.0, 1.0, 3.0, 2.0], 0.25) == pytest.approx(1.75)
    assert tb.quantile([7.0], 0.25) == 7.0


def test_the_forgery_checks_table_reads_a_traced_burst_as_the_judge_does(tmp_path):
    import json

    from conftest import REPO, load_module

    tool = load_module("forgery_check", REPO / "tools" / "forgery_check.py")
    said, spans = [100.0, 110.0, 90.0, 100.0], [2600.0, 2700.0, 2650.0, 2500.0]
    for cpu in (False, True):
        cal = tb.calibrate([400.0, 450.0, 500.0] * 4, cpu=cpu)
        trace = tmp_path / f"trace-{cpu}.jsonl"
        steps = [[20.0, 130.0, s - 40.0] for s in spans]  # inputs written, L2 flushed, answer in
        TimingTrace(str(trace)).write("candidate", "w", 0, [[s, 0, 0, 0] for s in said],
                                      bound=tb.trace_figures(spans, cal, steps))  # as the judge writes them
        assert json.loads(trace.read_text())["bound"]["steps_us"] == steps
        [row] = tool.bound_rows(trace)
        assert row["dropped"] is False
        floors = [tb.device_floor_us(s, cal) for s in spans]
        assert row["floor_us"] == pytest.approx(tb.quantile(floors, cal.quantile))
        caught = tb.contradiction(spans, said, cal) is not None
        assert (row["floor_us"] > row["threshold_us"]) == caught, (cpu, row)


def test_contradicted_bursts_are_dropped_up_to_a_limit_and_a_forger_that_backs_off_is_caught():
    cal = tb.calibrate([1200.0] * 20, cpu=True)
    lie = "the judge's clock leaves at least 9000 us"
    # A host busy through one burst: dropped, then the same story again is kept.
    rule = tb.ContradictionRule()
    assert rule.verdict(lie, [60.0] * 3, cal, "1-3")[0] == "drop"
    assert rule.verdict(None, [55.0] * 6, cal, "4-9") == ("keep", "")
    assert rule.verdict(None, [70.0] * 6, cal, "10-15") == ("keep", "")
    # A forged clock that lies again.
    rule = tb.ContradictionRule()
    rule.verdict(lie, [80.0] * 3, cal, "1-3")
    verdict, why = rule.verdict(lie, [80.0] * 3, cal, "4-6")
    assert verdict == "fail" and "as in calls 1-3 timed before them" in why
    # One that backs off to its true 80 ms after the lie was dropped.
    rule = tb.ContradictionRule()
    rule.verdict(lie, [80.0] * 3, cal, "1-3")
    verdict, why = rule.verdict(None, [80_000.0] * 3, cal, "4-6")
    assert verdict == "fail" and "reported 80 us for calls 1-3" in why
    # A GPU host that stalls whole bursts now and then: up to max_dropped of them are timed again, the next fails.
    rule = tb.ContradictionRule(max_dropped=3)
    assert [rule.verdict(lie, [60.0] * 3, cal, f"{k}")[0] for k in range(3)] == ["drop"] * 3
    assert rule.verdict(None, [58.0] * 3, cal, "3") == ("keep", "")
    verdict, why = rule.verdict(lie, [60.0] * 3, cal, "4")
    assert verdict == "fail" and "as in calls 0, 1, 2 timed before them" in why
    # Backing off is judged after every dropped burst, not only the first.
    rule = tb.ContradictionRule(max_dropped=3)
    rule.verdict(lie, [80.0] * 3, cal, "1-3")
    assert rule.verdict(None, [80.0] * 3, cal, "4-6") == ("keep", "")
    rule.verdict(lie, [80.0] * 3, cal, "7-9")
    verdict, why = rule.verdict(None, [80_000.0] * 3, cal, "10-12")
    assert verdict == "fail" and "for calls 7-9" in why


def test_repeated_inputs_are_compared_above_the_floor_of_a_timed_call():
    """Timed calls carry the floor of a call that does nothing (flush, cover, events: ~50 us on an H100), untimed
    back-to-back calls do not. An honest 14 us kernel timed at 65 us is not a cache; a 1 ms kernel whose repeated
    calls take 20 us is."""
    import pytest

    from ksearch_graph.harness.judge.reply_checks import check_burst_timings
    from ksearch_graph.harness.reporting import Failure

    honest = [[65.5, 0.0, 0.0, 90.0, 8.0, 90.0], [66.0, 0.0, 0.0, 92.0, 8.0, 92.0]]
    check_burst_timings(honest, 12.0, "w", floor_us=51.0)
    with pytest.raises(Failure, match="cached results"):  # without the floor, the old false alarm
        check_burst_timings(honest, 12.0, "w")
    caching = [[1000.0, 0.0, 0.0, 1100.0, 8.0, 1100.0]]
    with pytest.raises(Failure, match="cached results"):
        check_burst_timings(caching, 20.0, "w", floor_us=51.0)
    # A floor above the call: nothing to compare.
    check_burst_timings([[40.0, 0.0, 0.0, 60.0, 8.0, 60.0]], 1.0, "w", floor_us=51.0)


def test_repeated_inputs_are_held_to_the_speed_up_the_reference_itself_gets():
    """GPU MODE references evaluated as candidates on an H100: heat 66 us against 347 us timed after the L2 flush
    (inputs that fit in L2 run warm when repeated). Judged against the reference's own ratio, the same kernel passes;
    a cache that skips the work on repeated inputs is still far below it."""
    import pytest

    from ksearch_graph.harness.judge.reply_checks import check_burst_timings
    from ksearch_graph.harness.reporting import Failure

    timed = [[347.2, 0.0, 0.0, 400.0, 8.0, 400.0]]
    with pytest.raises(Failure):
        check_burst_timings(timed, 50.0, "w", floor_us=51.0)  # without the reference's figure: flagged
    check_burst_timings(timed, 50.0, "w", floor_us=51.0, reference=(64.0, 340.0))
    with pytest.raises(Failure, match="reference itself ran repeated inputs at 0.22"):
        check_burst_timings(timed, 5.0, "w", floor_us=51.0, reference=(64.0, 340.0))


def test_an_honest_kernel_runs_its_l2_resident_inputs_several_times_faster_warm():
    """GQA decode variants on an H100 (b16_heavy, b16_chat): heat on repeated inputs 35-37 us against 76-97 us timed
    after the flush on fresh memory, while the slow reference gains nothing warm. Not a cache."""
    from ksearch_graph.harness.judge.reply_checks import check_burst_timings

    check_burst_timings([[75.7, 0.0, 0.0, 240.0, 8.0, 240.0]], 34.9, "w", floor_us=1.6, reference=(6700.0, 6690.0))
    check_burst_timings([[96.5, 0.0, 0.0, 260.0, 8.0, 260.0]], 36.5, "w", floor_us=1.6, reference=(6700.0, 6690.0))


def test_a_launch_longer_than_the_covers_hold_is_not_counted_as_work():
    """A CuPy candidate on an H200 (a 1M-float scale, the machine's first evaluation): untimed calls 7.0 us, timed calls
    61.7 us, the reference no faster warm. Its Python launch (CuPy's argument packing) outlasted the launch cover's
    hold, so the device idled inside the timed call's events, which back-to-back calls hide: not a cache. A cache
    whose launch is short is still flagged."""
    import pytest

    from ksearch_graph.harness.judge.reply_checks import check_burst_timings
    from ksearch_graph.harness.reporting import Failure

    slow_launch = [[61.7, 0.0, 0.0, 90.0, 75.0, 95.0], [63.0, 0.0, 0.0, 92.0, 77.0, 97.0]]
    check_burst_timings(slow_launch, 7.0, "w", floor_us=5.0, reference=(9.0, 8.0))
    with pytest.raises(Failure, match="cached results"):  # the same device times with a launch the cover hid
        check_burst_timings([[t[0], 0.0, 0.0, t[3], 10.0, t[5]] for t in slow_launch], 7.0, "w", floor_us=5.0,
                            reference=(9.0, 8.0))
    # A cache that waits for the device inside its timed calls (tests/cheats/cool_fillers.py on an H100): its
    # launch is as long as its 400 us of work, of which only the allowance counts as idle.
    waiting = [[400.0, 0.0, 0.0, 420.0, 400.0, 430.0]]
    with pytest.raises(Failure, match="cached results"):
        check_burst_timings(waiting, 3.0, "w", floor_us=50.0, reference=(500.0, 520.0))


def test_a_workloads_spread_is_widened_to_the_evaluations_on_a_gpu_host():
    """Eight calls of one workload can show a spread of 80 us where the evaluation's 112 calibration calls show 230
    (an H100 host, GQA decode): each workload is judged with the larger, so an honest burst timed later, whose
    steps drifted by a few hundred us, is not called forged; a workload with the larger spread keeps its own."""
    from ksearch_graph.harness.judge.time_bound import calibrate, contradiction, pooled

    quiet = [1100.0, 1110.0, 1120.0, 1105.0, 1115.0, 1125.0, 1180.0]
    drifting = [1000.0, 1150.0, 1300.0, 1450.0, 1200.0, 1350.0, 1500.0]
    stalled = [1100.0] * 6 + [3000.0]
    overheads = {"quiet": quiet, "drifting": drifting, "stalled": stalled}
    cals = {name: calibrate(values) for name, values in overheads.items()}
    widened = pooled(cals, overheads)
    assert widened["quiet"].noise_us > cals["quiet"].noise_us
    assert widened["quiet"].overhead_us == cals["quiet"].overhead_us
    assert widened["stalled"] == cals["stalled"]
    spans = [1115.0 + 600.0 + 420.0] * 10  # a 600 us call whose steps took 420 us longer than at calibration
    assert contradiction(spans, [600.0] * 10, cals["quiet"]) is not None
    assert contradiction(spans, [600.0] * 10, widened["quiet"]) is None
    assert contradiction([1115.0 + 1500.0] * 10, [150.0] * 10, widened["quiet"]) is not None  # a 10x lie still fails
