"""harness/time_bound.py: the judge's own bound on a candidate's device time, on figures shaped like real bursts."""

import pytest

from ksearch_graph.harness import time_bound as tb
from ksearch_graph.harness.policy import POLICY


def test_reference_overheads_leave_out_the_call_and_its_fillers():
    stamps = [0.0, 0.0030, 0.0065]  # two calls: 3.0 and 3.5 ms between requests
    fills = [0.0, 0.0010, 0.0010]  # 1 ms of fillers ran in the first call's interval
    assert tb.reference_overheads(stamps, [1500.0, 2000.0], fills) == pytest.approx([500.0, 1500.0])


def test_calibration_adds_the_candidates_side_and_reads_the_spread_from_the_tail():
    cal = tb.calibrate([500.0] * 9 + [5000.0], extra_us=120.0)
    assert cal.overhead_us == pytest.approx(620.0)
    assert cal.noise_us == pytest.approx(4500.0)  # the 90th percentile is the slow call
    assert tb.calibrate([500.0, 510.0, 505.0], 0.0).noise_us == POLICY.bound_min_noise_us
    assert tb.calibrate([], 0.0) is None


def burst(true_us: float, said_us: float, overhead_us: float = 600.0, calls: int = 10) -> tuple:
    return [overhead_us + true_us] * calls, [said_us] * calls


CAL = tb.Calibration(overhead_us=600.0, noise_us=30.0)


@pytest.mark.parametrize("true_us", [5.0, 50.0, 800.0, 8000.0])
def test_an_honest_burst_is_never_contradicted(true_us):
    spans, said = burst(true_us, true_us)
    assert tb.contradiction(spans, said, CAL, False, 16.0) is None
    spans = [s * 1.3 for s in spans]  # a slower host on the candidate's side, within the slack
    assert tb.contradiction(spans, said, CAL, False, 16.0) is None or true_us > 1000


def test_a_long_call_cannot_report_much_less_than_it_took():
    spans, said = burst(8000.0, 6000.0)  # 25% under: caught
    assert "judge's clock" in tb.contradiction(spans, said, CAL, False, 16.0)
    spans, said = burst(8000.0, 7200.0)  # 10% under: within the slack
    assert tb.contradiction(spans, said, CAL, False, 16.0) is None


def test_a_short_call_hides_in_the_overheads_spread_but_not_a_gross_lie():
    spans, said = burst(20.0, 10.0)
    assert tb.contradiction(spans, said, CAL, False, 16.0) is None
    spans, said = burst(8189.0, 1.0)  # the TriMul figures
    assert tb.contradiction(spans, said, CAL, False, 16.0) is not None


def test_a_collection_in_one_call_does_not_decide():
    spans, said = burst(300.0, 300.0)
    spans[3] += 20000.0
    assert tb.contradiction(spans, said, CAL, False, 16.0) is None


def test_work_moved_into_one_calls_interval_is_caught_on_the_whole_burst():
    spans, said = burst(1.0, 1.0, calls=10)
    spans[-1] += 10 * 8000.0  # every call's work done at the end
    assert "burst's 10 calls" in tb.contradiction(spans, said, CAL, False, 16.0)


def test_power_limited_fillers_loosen_the_floor_to_gross_lies():
    # An honest 1 ms call with the fillers the rule allows (16x) and three calls of overshoot in its interval.
    honest = [600.0 + 1000.0 + 16 * 1000.0 + 3 * 1000.0] * 10
    assert tb.contradiction(honest, [1000.0] * 10, CAL, True, 16.0) is None
    # Reporting 1 us: the fillers shrink to one call, the interval still holds two calls of 1 ms.
    liar = [600.0 + 1000.0 + 1000.0] * 10
    assert tb.contradiction(liar, [1.0] * 10, CAL, True, 16.0) is not None
    assert tb.contradiction(liar, [400.0] * 10, CAL, True, 16.0) is None  # 2.5x under: not caught here


def test_without_calibration_nothing_is_judged():
    assert tb.contradiction([1e6], [1.0], None, False, 16.0) is None


def test_on_cpu_a_share_of_delayed_hand_overs_does_not_decide_but_a_forged_clock_does():
    cpu = tb.calibrate([500.0] * 20, extra_us=700.0, cpu=True)
    assert (cpu.rel_slack, cpu.quantile) == (POLICY.bound_rel_slack_cpu, POLICY.bound_quantile_cpu)
    # An honest 2.5 ms call whose process a loaded host woke 5 ms late after half of its calls (the softmax seed
    # under the Triton interpreter on a two-core host shared with other jobs).
    spans = [1200.0 + 2500.0 + (5000.0 if k % 2 else 300.0) for k in range(12)]
    said = [2500.0] * 12
    assert tb.contradiction(spans, said, cpu, False) is None
    assert tb.contradiction(spans, said, tb.calibrate([500.0] * 20, extra_us=700.0), False) is not None  # GPU rule
    # A clock forged to read a tenth, on every call: caught.
    assert "quantile" in tb.contradiction(spans, [250.0] * 12, cpu, False)


def test_on_cpu_a_host_that_runs_the_steps_around_each_call_slower_does_not_decide():
    # The GPU MODE linear task's calls on a two-core CI host: ~1.6 ms of steps around each 60-190 us call, run 2.3x
    # slower than when the reference calibrated them (a busy SMT sibling shows on no run queue).
    cpu = tb.calibrate([900.0] * 20, extra_us=700.0, cpu=True)
    said = [190.0] * 6
    slow = [2.3 * cpu.overhead_us + 190.0] * 6
    assert tb.contradiction(slow, said, cpu, False) is None
    assert tb.contradiction(slow, said, tb.calibrate([900.0] * 20, extra_us=700.0), False) is not None  # GPU rule
    # A clock forged to a thousandth on an 80 ms call (tests/cheats/forge_blind_guard.py) stays gross there.
    assert tb.contradiction([2.3 * cpu.overhead_us + 80_000.0] * 6, [80.0] * 6, cpu, False) is not None


def test_quantile_interpolates_and_its_half_is_the_median():
    assert tb.quantile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert tb.quantile([4.0, 1.0, 3.0, 2.0], 0.25) == pytest.approx(1.75)
    assert tb.quantile([7.0], 0.25) == 7.0


def test_the_judges_interval_leaves_out_the_time_either_process_waited_to_run():
    import os

    stamps = [(0.0, 0.0), (0.010, 0.004), (0.013, 0.004)]  # 4 ms of the first call's 10 spent waiting to run
    assert tb.call_spans_us(stamps) == pytest.approx([6000.0, 3000.0])
    now, waited = tb.stamp(os.getpid())
    assert now > 0 and waited >= 0


def test_the_forgery_checks_table_reads_a_traced_burst_as_the_judge_does(tmp_path):
    import json

    from conftest import REPO, load_module

    tool = load_module("forgery_check", REPO / "tools" / "forgery_check.py")
    said, spans = [100.0, 110.0, 90.0, 100.0], [2600.0, 2700.0, 2650.0, 2500.0]
    for limited, cpu in ((True, False), (False, False), (False, True)):
        cal = tb.calibrate([400.0, 450.0, 500.0] * 4, extra_us=100.0, cpu=cpu)
        trace = tmp_path / f"trace-{limited}-{cpu}.jsonl"
        bound = tb.trace_figures(spans, cal, limited)  # as the judge writes them
        trace.write_text(json.dumps({"who": "candidate", "workload": "w", "first": 0,
                                     "calls": [[s, 0, 0, 0] for s in said], "bound": bound}) + "\n")
        [row] = tool.bound_rows(trace)
        assert row["dropped"] is False
        floors = [tb.device_floor_us(s, r, cal, limited) for s, r in zip(spans, said)]
        assert row["floor_us"] == pytest.approx(tb.quantile(floors, cal.quantile))
        caught = tb.contradiction(spans, said, cal, limited) is not None
        assert (row["floor_us"] > row["threshold_us"]) == caught, (limited, cpu, row)


def test_a_contradicted_burst_is_dropped_once_and_a_forger_that_backs_off_is_caught():
    cal = tb.calibrate([500.0] * 20, extra_us=700.0, cpu=True)
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
