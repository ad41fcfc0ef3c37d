"""The harness's own features, end to end through SubprocessEvaluator on small tasks written here: the judge/runner
split (hostile messages, patched input generation, network namespace), correctness-only workloads, baselines,
KernelBench-style module entry points, separate compile and call limits, and, on a GPU, CUDA C++ through CuPy/NVRTC
and torch extensions, and the GPU's health after an illegal memory access.

The planted cheats of docs/harness.md's threat model are in test_cheats.py; the softmax example's cases in test_evaluation.py.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from ksearch_graph.evaluation import EvalResult, Status, SubprocessEvaluator
from ksearch_graph.task import Task, load_task

CUDA = torch.cuda.is_available()

SCALE_REFERENCE = '''
import torch


def make_inputs(params, seed, device):
    g = torch.Generator(device=device).manual_seed(seed)
    return (torch.randn(params["n"], generator=g, device=device), float(params.get("alpha", 2.0)))


def reference(x, alpha):
    return x * alpha
'''

HONEST = "def scale(x, alpha):\n    return x * alpha\n"


def write_task(root: Path, **overrides) -> Task:
    root.mkdir(parents=True, exist_ok=True)
    manifest = {
        "name": root.name, "entry_point": "scale", "language": "pytorch", "solution_file": "kernel.py",
        "tolerance": {"atol": 1e-5, "rtol": 1e-5}, "correctness_seeds": 2,
        "workloads": [{"name": "small", "params": {"n": 1000}}, {"name": "big", "params": {"n": 1 << 16}}],
    }
    manifest.update(overrides)
    (root / "task.json").write_text(json.dumps(manifest))
    (root / "spec.md").write_text("y = x * alpha\n")
    if not (root / "reference.py").exists():
        (root / "reference.py").write_text(SCALE_REFERENCE)
    return load_task(root)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> dict[str, Task]:
    base = tmp_path_factory.mktemp("harness")
    (base / "baseline").mkdir()
    (base / "baseline" / "baseline.py").write_text("import torch\n\n\ndef scale(x, alpha):\n    return torch.mul(x, alpha)\n")
    (base / "small_values").mkdir()
    (base / "small_values" / "reference.py").write_text(SCALE_REFERENCE.replace("x * alpha", "x * alpha * 1e-4"))
    (base / "module").mkdir()
    (base / "module" / "reference.py").write_text(MODULE_REFERENCE)
    return {
        "scale": write_task(base / "scale"),
        "mixed": write_task(base / "mixed", workloads=[
            {"name": "check-only", "params": {"n": 77}, "timed": False},
            {"name": "timed", "params": {"n": 4096}},
        ]),
        "baseline": write_task(base / "baseline", baseline="baseline.py"),
        "small_values": write_task(base / "small_values", tolerance={"atol": 1e-2, "rtol": 1e-2}),
        "module": write_task(base / "module", entry_point="ModelNew", entry_kind="module", solution_file="model_new.py",
                             workloads=[{"name": "default", "params": {"batch": 8}}]),
        "cupy": write_task(base / "cupy", language="cupy"),
    }


MODULE_REFERENCE = '''
import torch


class Model(torch.nn.Module):
    def __init__(self, features, hidden):
        super().__init__()
        self.fc = torch.nn.Linear(features, hidden)

    def forward(self, x):
        return torch.relu(self.fc(x))


def make_inputs(params, seed, device):
    torch.manual_seed(seed)
    init = [16, 32]
    model = Model(*init)
    x = torch.randn(params["batch"], 16).to(device)
    return (init, {k: v.to(device) for k, v in model.state_dict().items()}, x)


reference = Model
'''

MODEL_NEW = '''
import torch


class ModelNew(torch.nn.Module):
    def __init__(self, features, hidden):
        super().__init__()
        self.fc = torch.nn.Linear(features, hidden)

    def forward(self, x):
        return torch.addmm(self.fc.bias, x, self.fc.weight.t()).clamp_min(0)
'''

PATCHES_INPUT_GENERATION = '''
import torch

_randn = torch.randn
torch.randn = lambda *a, **k: _randn(*a, **k).abs()  # easier inputs, hoping the judge sees the same


def scale(x, alpha):
    return x * alpha
'''

HOSTILE_PICKLE = '''
import os
from multiprocessing.reduction import ForkingPickler


class Payload:
    def __reduce__(self):
        return (os.system, ("touch {marker}",))


_dumps = ForkingPickler.dumps
ForkingPickler.dumps = classmethod(lambda cls, obj, protocol=None: _dumps((obj, Payload())))


def scale(x, alpha):
    return x * alpha
'''

NETWORK = '''
import socket

reached = []
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2).close()
    reached.append("127.0.0.1:{port}")
except OSError:
    pass


def scale(x, alpha):
    if reached:
        raise RuntimeError(f"NETWORK REACHED {{reached}}")
    return x * alpha
'''

CALLS_REFERENCE = '''
import sys


def scale(x, alpha):
    return sys.modules["ksearch_task_inputs"].reference(x, alpha)
'''

SLOW_IMPORT = "import time\ntime.sleep(60)\n\n\n" + HONEST

HANGS_ON_SECOND_CALL = '''
import time

calls = []


def scale(x, alpha):
    calls.append(1)
    if len(calls) == 2:
        time.sleep(60)
    return x * alpha
'''


@pytest.fixture(scope="module")
def listener():
    """A TCP server in the test's own network namespace: the candidate must not reach it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    thread = threading.Thread(target=lambda: [server.accept() for _ in range(3)], daemon=True)
    thread.start()
    yield server.getsockname()[1]
    server.close()


@pytest.fixture(scope="module")
def results(tasks, listener, tmp_path_factory) -> dict[str, EvalResult]:
    marker = tmp_path_factory.mktemp("pwn") / "pwned"
    quick = SubprocessEvaluator(timeout_s=120, time_budget_s=0.1, workloads="all")
    limited = SubprocessEvaluator(timeout_s=120, time_budget_s=0.1, compile_timeout_s=4, call_timeout_s=4,
                                  workloads="all")
    jobs = {
        "honest": (quick, "scale", HONEST),
        "mixed": (quick, "mixed", HONEST),
        "baseline": (quick, "baseline", HONEST),
        "zeros_small_values": (quick, "small_values", "import torch\n\n\ndef scale(x, alpha):\n"
                                                      "    return torch.zeros_like(x)\n"),
        "module": (quick, "module", MODEL_NEW),
        "module_wrong": (quick, "module", MODEL_NEW.replace(".clamp_min(0)", "")),
        "module_needs_grad": (quick, "module", MODEL_NEW.replace(
            "    def forward(self, x):\n", "    def forward(self, x):\n        assert not torch.is_grad_enabled(), 'GRAD ON'\n")),
        "patched_inputs": (quick, "scale", PATCHES_INPUT_GENERATION),
        "hostile_pickle": (quick, "scale", HOSTILE_PICKLE.format(marker=marker)),
        "network": (quick, "scale", NETWORK.format(port=listener)),
        "calls_reference": (quick, "scale", CALLS_REFERENCE),
        "slow_import": (limited, "scale", SLOW_IMPORT),
        "hangs_on_second_call": (limited, "scale", HANGS_ON_SECOND_CALL),
        "cupy_on_cpu": (quick, "cupy", HONEST),
    }
    if CUDA:
        jobs = {k: v for k, v in jobs.items() if k != "cupy_on_cpu"}
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {}
        for name, (ev, task, source) in jobs.items():
            files = {tasks[task].spec.solution_file: source}
            futures[name] = pool.submit(ev.evaluate, tasks[task], files, attempt_id=name)
        out = {name: f.result() for name, f in futures.items()}
    out["_marker"] = marker
    return out


def explain(r: EvalResult) -> str:
    return f"{r.status.value}: {r.log_excerpt}"


def test_honest_candidate_passes_with_phases_and_environment(results):
    r = results["honest"]
    assert r.status == Status.passed, explain(r)
    assert {"reference", "correctness", "timing", "checks", "spawn", "imports", "startup"} <= set(r.phases)
    assert r.environment["network_isolated"].startswith(("yes", "no"))
    assert all(w.timed and w.runs >= 3 for w in r.workloads)


def test_correctness_only_workloads_are_checked_but_not_timed(results):
    r = results["mixed"]
    assert r.status == Status.passed, explain(r)
    check_only, timed = r.workloads
    assert check_only.workload == "check-only" and check_only.correct and not check_only.timed
    assert check_only.latency_us is None and check_only.runs == 0
    assert timed.timed and timed.latency_us > 0
    assert r.score == pytest.approx(timed.speedup)  # the geometric mean is over timed workloads only


def test_baseline_is_timed_and_scored(results):
    r = results["baseline"]
    assert r.status == Status.passed, explain(r)
    ratios = [w.baseline_us / w.latency_us for w in r.workloads]
    assert all(w.baseline_us > 0 and w.speedup_vs_baseline == pytest.approx(x) for w, x in zip(r.workloads, ratios))
    assert r.baseline_score == pytest.approx(100 * sum(ratios) / len(ratios))
    assert r.speedup_vs_baseline == pytest.approx(math.exp(sum(map(math.log, ratios)) / len(ratios)))


def test_zeros_fail_even_where_the_reference_is_below_atol(results):
    r = results["zeros_small_values"]
    assert r.status == Status.incorrect_numerical, explain(r)
    assert "relative L2 error" in r.log_excerpt


def test_module_entry_points(results):
    assert results["module"].status == Status.passed, explain(results["module"])
    assert results["module_wrong"].status == Status.incorrect_numerical, explain(results["module_wrong"])
    # Called in inference mode, as the reference is: no autograd graph to record on the candidate's clock.
    assert results["module_needs_grad"].status == Status.passed, explain(results["module_needs_grad"])


def test_patched_input_generation_is_suspicious(results):
    r = results["patched_inputs"]
    assert r.status == Status.suspicious, explain(r)
    assert "differed" in r.log_excerpt


def test_a_hostile_message_from_the_candidates_process_runs_nothing(results):
    r = results["hostile_pickle"]
    assert r.status == Status.suspicious, explain(r)
    assert "not a plain tensor" in r.log_excerpt
    assert not results["_marker"].exists()


def test_the_candidate_has_no_network(results):
    r = results["network"]
    if not r.environment.get("network_isolated", "").startswith("yes"):
        pytest.skip(f"no network namespace here: {r.environment.get('network_isolated')}")
    assert r.status == Status.passed, explain(r)


def test_calling_the_reference_passes_but_is_flagged(results):
    r = results["calls_reference"]
    assert r.status == Status.passed, explain(r)
    assert "calls_reference" in r.flags and "reference implementation" in r.log_excerpt


def test_compile_and_call_limits_are_separate(results):
    r = results["slow_import"]
    assert r.status == Status.timeout, explain(r)
    assert "compiling" in r.log_excerpt and "4 s" in r.log_excerpt
    r = results["hangs_on_second_call"]
    assert r.status == Status.timeout, explain(r)
    assert "input set 2/2" in r.log_excerpt and r.wall_s < 60


def test_a_burst_that_leaves_work_running_is_timed_again_then_charged():
    """Side-stream work, judged per burst on the mean of tail minus probe, its largest call left out: a burst over
    max(10 us, 20% of its median call) is dropped (an honest host's wake-ups can read long for a whole burst), twice;
    the third charges the workload. One long call, or a tail within the slack, is kept; work hidden in a minority of
    calls is not."""
    from ksearch_graph._evaluate_child import ESCAPE_SLACK_US, SideStreamRule

    call = [77.0] * 10
    honest = SideStreamRule()
    assert honest.verdict(call, [3.0] * 9 + [144.0]) == "keep"  # one long wake-up (a collection) is left out
    assert honest.verdict(call, [3.0] * 8 + [40.0] * 2) == "keep"  # (3 * 8 + 40) / 9 = 7.1 us
    assert honest.verdict(call, [ESCAPE_SLACK_US + 5] * 10) == "keep"  # within 20% of a 77 us call (15.4 us)
    assert honest.verdict(call, [17.0] * 10) == "drop"  # session 15's honest burst
    assert honest.verdict(call, [2.0] * 10) == "keep" and not honest.charged  # timed again: clean
    assert honest.verdict(call, [-30.0] * 4 + [40.0] * 6) == "drop"  # a long probe offsets no other call's tail
    assert SideStreamRule().verdict([1000.0] * 10, [150.0] * 10) == "keep"  # 20% of the call is the slack
    assert SideStreamRule().verdict([5.0] * 10, [ESCAPE_SLACK_US + 1] * 10) == "drop"  # 10 us at least
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


class _StandInRunner:
    """Stands in for the candidate's process in the judge's timing loop (Judge.time_candidate): serves its protocol
    (warm, burst, one seed at a time, timed, send, drop) with the device times ``call_us(burst, call)``, long tails
    in the bursts ``long_tails``, and ``flags``: power_limited, and its heat as a running total, ``first_heat_s``
    spent (slept) in the first burst, plus ``claimed_heat_s`` per burst that it only says it spent."""

    def __init__(self, rl, long_tails=(), call_us=lambda burst, call: 77.0 + burst, limited=False,
                 first_heat_s=0.0, claimed_heat_s=0.0):
        self.rl, self.long_tails, self.call_us, self.limited = rl, set(long_tails), call_us, limited
        self.first_heat_s, self.claimed_heat_s, self.heat_s = first_heat_s, claimed_heat_s, 0.0
        self.bursts, self.seeds, self.pending = [], [], None

    def request(self, msg, timeout_s, phase):
        if msg[0] == "warm":
            return "warm", 1e-4
        if msg[0] == "burst":
            self.pending = {"n": msg[3], "seeds": []}
            self.bursts.append(self.pending)
            if len(self.bursts) == 1:
                time.sleep(self.first_heat_s)
                self.heat_s += self.first_heat_s
            self.heat_s += self.claimed_heat_s
            return "next", 0
        if msg[0] == "seed":
            self.pending["seeds"].append(msg[1])
            self.seeds.append(msg[1])
            if len(self.pending["seeds"]) < self.pending["n"]:
                return "next", len(self.pending["seeds"])
            k = len(self.bursts) - 1
            tail = 60.0 if k in self.long_tails else 3.0
            timed = [[float(self.call_us(k, i)), tail, 1.0, 2e5] for i in range(self.pending["n"])]
            prints = [self.rl.fingerprint(out) for out in self.outputs()]
            flags = {"power_limited": self.limited, "heat_s": self.heat_s, "fill_s": 0.0}
            return "timed", timed, prints, flags, None
        if msg[0] == "send":
            out = self.outputs()[msg[1]]
            return "sent", out, [out.clone()], None, None, None
        raise AssertionError(msg)

    def outputs(self):
        return [torch.full((4,), float(seed % 1000)) for seed in self.pending["seeds"]]

    def send(self, msg):
        assert msg == ("drop",)


def _bare_judge(budget_s: float = 0.0, trace_path: str | None = None):
    """A Judge with only what its timing loop needs (no processes, no task): inputs are one tensor from the seed, the
    reference returns it, and every check passes. ``budget_s``: 0 stops at min_runs where the rule allows."""
    import random
    from types import SimpleNamespace

    from ksearch_graph import _evaluate_child as judge

    j = judge.Judge.__new__(judge.Judge)
    j.min_runs, j.base_seed, j.rng = 10, 12345, random.Random(0)
    j.args = SimpleNamespace(time_budget_s=budget_s, call_timeout_s=30.0)
    j.call_bytes, j.power_limited, j.trace_path = {"w": 1 << 10}, {}, trace_path
    j.phases = {"timing_heat": 0.0, "timing_fill": 0.0, "reference": 0.0, "checks": 0.0}
    j.inputs = lambda w, seed: [torch.full((4,), float(seed % 1000))]
    j.reference = lambda inputs: inputs[0]
    j.check = lambda *a, **k: (0.0, 0.0)
    return j


def test_the_judge_drops_a_flagged_burst_times_fresh_inputs_and_charges_the_third(tmp_path):
    """The judge's timing loop with a stand-in for the candidate's process that reports long tails in chosen bursts:
    a dropped burst's calls are not in the result, every burst gets seeds of its own, the trace marks the dropped
    ones, and a third flagged burst charges every kept call its tail."""
    from ksearch_graph import _evaluate_child as judge

    rl = judge.rl  # the judge's own import of the runner module
    rl.load_torch()
    w = {"name": "w", "params": {}}
    trace = tmp_path / "trace.jsonl"
    # The first burst reads long tails: dropped, timed again on fresh seeds, clean.
    runner = _StandInRunner(rl, long_tails={0})
    times, notes = _bare_judge(trace_path=str(trace)).time_candidate(runner, w)
    assert times == [78.0] * 10  # the second burst's calls only, without their tails
    assert len(runner.bursts) == 2 and len(set(runner.seeds)) == 20  # no input set twice
    assert len(notes) == 1 and "calls 1-10" in notes[0] and "dropped and timed again" in notes[0]
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [(line["first"], line.get("dropped", False)) for line in lines] == [(0, True), (10, False)]

    # Three flagged bursts in a row: two dropped, the third charged and kept with its tails.
    runner = _StandInRunner(rl, long_tails={0, 1, 2})
    times, notes = _bare_judge().time_candidate(runner, w)
    assert len(runner.bursts) == 3 and len(set(runner.seeds)) == 30
    assert times == [79.0 + 60.0] * 10
    assert "every call timed until the whole device was idle" in notes[-1] and "2 dropped" in notes[-1]


def test_a_power_limited_workload_gets_three_bursts_where_they_fit_and_is_judged_on_their_means():
    """Under the power cap a burst's calls share its clock state, so one burst cannot say how far the next would
    read: the judge times a power-limited workload in LIMITED_MIN_BURSTS bursts when they fit in the budget (its
    first heat not counted in that sum), not where they do not, and once it has two or more, it goes on while their
    means disagree (within the budget). What the candidate's process says its heat took counts only as far as this
    side saw the time pass."""
    from ksearch_graph import _evaluate_child as judge

    rl = judge.rl
    rl.load_torch()
    w = {"name": "w", "params": {}}
    steady = lambda burst, call: 100.0 + 0.1 * (call % 2)  # noqa: E731  (each burst's calls agree to 0.05%)
    # Cheap bursts (a later one costs its 0.2 s heat): three.
    runner = _StandInRunner(rl, call_us=steady, limited=True)
    times, _ = _bare_judge(budget_s=0.6).time_candidate(runner, w)
    assert len(runner.bursts) == rl.LIMITED_MIN_BURSTS == 3 and len(times) == 30
    # A budget that two more bursts' heats overrun: one burst, judged on its calls as before.
    runner = _StandInRunner(rl, call_us=steady, limited=True)
    times, _ = _bare_judge(budget_s=0.3).time_candidate(runner, w)
    assert len(runner.bursts) == 1
    # A first heat of 0.35 s is left out of the sum (0.35 + 0.4 > 0.6, but 0.4 fits): three.
    runner = _StandInRunner(rl, call_us=steady, limited=True, first_heat_s=0.35)
    _bare_judge(budget_s=0.6).time_candidate(runner, w)
    assert len(runner.bursts) == 3
    # A process that says each heat took 100 s, having spent none: no room made by it.
    runner = _StandInRunner(rl, call_us=steady, limited=True, claimed_heat_s=100.0)
    _bare_judge(budget_s=0.3).time_candidate(runner, w)
    assert len(runner.bursts) == 1
    # Not power-limited: one burst whose calls agree is enough, however cheap more would be.
    runner = _StandInRunner(rl, call_us=steady)
    _bare_judge(budget_s=10.0).time_candidate(runner, w)
    assert len(runner.bursts) == 1
    # Bursts whose means disagree by 4% (each burst steady): on until the budget is spent or MAX_RUNS.
    runner = _StandInRunner(rl, call_us=lambda burst, call: 100.0 + 4.0 * (burst % 2), limited=True)
    times, _ = _bare_judge(budget_s=10.0).time_candidate(runner, w)
    assert len(times) == rl.MAX_RUNS


def test_a_later_burst_is_priced_with_a_later_bursts_heat():
    """What one more burst costs: the last one's time with its heat (a first heat runs until the calls stop slowing,
    up to 0.5 s) replaced by a later burst's."""
    from ksearch_graph import _evaluate_child as judge

    rl = judge.rl
    now = time.perf_counter()
    assert judge.next_burst_s(now - 0.6, 0.5, limited=True) == pytest.approx(0.1 + rl.HEAT_MIN_S, abs=0.05)
    assert judge.next_burst_s(now - 0.3, 0.2, limited=False) == pytest.approx(0.1 + rl.HEAT_S, abs=0.05)


def test_timing_stops_on_burst_means_for_a_power_limited_workload():
    """The stopping rule itself: bursts whose calls agree but whose means do not are not precise for a power-limited
    workload (they would be for another); three bursts are asked for only while they fit in the budget."""
    from ksearch_graph import _candidate_runner as rl

    apart = [100.0] * 10 + [104.0] * 10 + [100.0] * 10  # three steady bursts, means 4% apart
    assert rl.precise_enough(apart, 0.0, 1.0, 0.1, sizes=[30])  # as one burst of calls (1.8% each): 0.34%
    assert not rl.precise_enough(apart, 0.0, 1.0, 0.1, limited=True, sizes=[10, 10, 10])  # 1.3% between bursts
    assert rl.precise_enough(apart, 0.0, 1.0, 1.1, limited=True, sizes=[10, 10, 10])  # the budget is spent
    steady = [100.0, 100.2] * 5
    assert not rl.precise_enough(steady, 0.0, 1.0, 0.1, limited=True, sizes=[10], next_burst_s=0.3)  # 0.1 + 0.6 fit
    assert rl.precise_enough(steady, 0.0, 1.0, 0.5, limited=True, sizes=[10], next_burst_s=0.3)  # 0.5 + 0.6 do not
    assert rl.precise_enough(steady, 0.0, 1.0, 0.1, sizes=[10], next_burst_s=0.3)  # not limited: one burst
    # A first heat of 0.45 s does not decide whether three fit (0.7 - 0.45 + 0.4 do); the budget still counts it.
    assert rl.precise_enough(steady, 0.0, 1.0, 0.7, limited=True, sizes=[10], next_burst_s=0.2)
    assert not rl.precise_enough(steady, 0.0, 1.0, 0.7, limited=True, sizes=[10], next_burst_s=0.2, first_heat_s=0.45)
    noisy = [100.0, 106.0] * 5  # 1% relative standard error: on until the budget is spent, its heat included
    assert rl.precise_enough(noisy, 0.0, 1.0, 1.1, limited=True, sizes=[10], next_burst_s=0.6, first_heat_s=0.45)
    # Two bursts whose means agree by chance: the calls' own error (1%) still decides.
    assert not rl.precise_enough(noisy * 2, 0.0, 1.0, 0.5, limited=True, sizes=[10, 10])
    assert rl.precise_enough(steady * 2, 0.0, 1.0, 0.5, limited=True, sizes=[10, 10])


def test_timing_bursts_grow_within_memory_budget_and_run_limits(monkeypatch):
    """Timed calls run in bursts on inputs generated beforehand: MIN_RUNS first, then twice what was done, within
    half the time budget, the burst memory and MAX_RUNS; a workload too big for the burst memory goes one call at a
    time."""
    from types import SimpleNamespace

    from ksearch_graph import _candidate_runner as rl
    from ksearch_graph import _evaluate_child as judge

    j = judge.Judge.__new__(judge.Judge)  # only the sizing rule: no processes
    j.min_runs, j.args = rl.MIN_RUNS, SimpleNamespace(time_budget_s=1.0)
    small = 1 << 20
    assert j.burst_size(0, small, 1e-3) == rl.MIN_RUNS
    assert j.burst_size(3, small, 1e-3) == 6 and j.burst_size(24, small, 1e-3) == 48
    assert j.burst_size(96, small, 1e-6) == rl.MAX_RUNS - 96  # never past MAX_RUNS in all
    assert j.burst_size(3, small, 0.2) == rl.MIN_RUNS  # 0.5 s of budget fits 2 calls: MIN_RUNS still
    # A power-limited workload: every burst the same length (a longer one reads faster under the cap).
    assert j.burst_size(3, small, 1e-3, limited=True) == j.burst_size(24, small, 1e-3, limited=True) == rl.MIN_RUNS
    assert j.burst_size(0, judge.BURST_BYTES_CPU // 2, 1e-3, limited=True) == 2  # the memory cap still
    assert j.burst_size(0, judge.BURST_BYTES_CPU // 2, 1e-3) == 2  # the memory cap
    assert j.burst_size(0, judge.BURST_BYTES_CPU * 3, 1e-3) == 1  # bigger than the cap: one call at a time
    # A memory that holds fewer than MIN_RUNS calls: MIN_RUNS in equal bursts (then a power-limited workload's bursts
    # stay that size; another's grow).
    j.min_runs = 10
    nine = judge.BURST_BYTES_CPU // 9
    assert j.burst_size(0, nine, 1e-3) == j.burst_size(5, nine, 1e-3) == 5
    assert j.burst_size(10, nine, 1e-3, limited=True) == 5 and j.burst_size(10, nine, 1e-3) == 9
    assert j.burst_size(0, judge.BURST_BYTES_CPU // 3, 1e-3) == 3  # 3 + 3 + 3 + 3: 4 bursts either way
    assert j.burst_size(0, judge.BURST_BYTES_CPU // 4, 1e-3) == 4  # 4 + 4 + 4
    # On a GPU the burst memory is an eighth of the device's, with no ceiling (an H200's 139 GiB: 17.4 GiB).
    monkeypatch.setattr(judge, "DEVICE", "cuda")
    monkeypatch.setattr(judge, "torch", SimpleNamespace(cuda=SimpleNamespace(
        get_device_properties=lambda device: SimpleNamespace(total_memory=139 << 30))))
    assert j.burst_size(0, 2 << 30, 1e-3) == 5  # 8 calls fit: 5 + 5
    assert j.burst_size(0, (139 << 30) // 8 // 10, 1e-3) == 10  # exactly 10 fit



def test_timing_stops_at_a_tighter_error_for_a_power_limited_workload():
    """A power-limited kernel's calls vary more: its timing goes on until the mean's relative standard error is below
    TARGET_RSE_LIMITED, not TARGET_RSE; the budget stops both."""
    from ksearch_graph import _candidate_runner as rl

    assert rl.TARGET_RSE_LIMITED < rl.TARGET_RSE
    times = [100.0, 103.0] * 8  # 16 calls, relative standard error 0.38% (1.5% per call)
    noisy = [100.0, 106.0] * 8  # 0.77%
    assert rl.precise_enough(times, 0.0, 1.0, 0.1) and rl.precise_enough(times, 0.0, 1.0, 0.1, limited=True)
    assert rl.precise_enough(noisy, 0.0, 1.0, 0.1) and not rl.precise_enough(noisy, 0.0, 1.0, 0.1, limited=True)
    assert rl.precise_enough(noisy, 0.0, 1.0, 1.1, limited=True)  # the budget is spent


def test_fingerprints_are_bit_exact_checksums_of_any_tensor(monkeypatch):
    """The checksum that catches an output changed after its call (and inputs that differ between the processes):
    equal bits give equal fingerprints, NaNs included; one changed bit, a sign of zero, a swapped dtype, sign flips
    that cancel in a sum of words do not. Views at any offset, odd byte counts, bools, complex (conjugate views too),
    float8 and empty tensors all work, and big tensors are summed a chunk at a time."""
    from ksearch_graph import _candidate_runner as rl

    rl.load_torch()
    x = torch.randn(1001)
    x[7] = float("nan")
    assert rl.fingerprint((x, 2)) == rl.fingerprint((x.clone(), 2))
    one_ulp = x.clone()
    one_ulp[500] = torch.nextafter(x[500], torch.tensor(math.inf))
    signed = x.clone()
    signed[3] = 0.0
    negative = signed.clone()
    negative[3] = -0.0
    assert rl.fingerprint(one_ulp) != rl.fingerprint(x) and rl.fingerprint(signed) != rl.fingerprint(negative)
    assert rl.fingerprint(x.view(torch.int32)) != rl.fingerprint(x)  # same bits, another dtype
    half = torch.randn(1001).half()
    for view in (half[1:], half[3:], torch.randn(6, 5)[:, 1], torch.ones(3, dtype=torch.bool),
                 torch.randn(4, dtype=torch.complex64), torch.zeros(0), torch.tensor(2.5)):
        assert rl.fingerprint(view) == rl.fingerprint(view.clone()), view
        changed = view.clone()
        if changed.numel():
            changed.view(-1)[-1] = 0 if changed.view(-1)[-1] != 0 else 1
            assert rl.fingerprint(changed) != rl.fingerprint(view), view
    negatives = torch.tensor([-1.0, -2.0, 3.0])  # two sign bits cleared: a sum modulo 2**32 would not change
    assert rl.fingerprint(negatives.abs()) != rl.fingerprint(negatives)
    balanced = torch.tensor([-1.0, 3.0, 2.0, -5.0])  # negated: two sign bits set, two cleared
    assert rl.fingerprint(-balanced) != rl.fingerprint(balanced)
    z = torch.randn(6, dtype=torch.complex64)
    assert rl.fingerprint(z.conj()) == rl.fingerprint(z.conj().resolve_conj()) != rl.fingerprint(z)
    fp8 = torch.randn(9).to(torch.float8_e4m3fn)  # no value sum for float8: the word sum still sees a change
    assert rl.fingerprint(fp8) == rl.fingerprint(fp8.clone()) != rl.fingerprint((-fp8.float()).to(fp8.dtype))
    chunked = torch.randn(1000)
    whole = rl.fingerprint(chunked)
    monkeypatch.setattr(rl, "CHECKSUM_CHUNK", 64)  # the int64 copies, a chunk at a time, add up the same
    assert rl.fingerprint(chunked) == whole


def test_heat_lasts_until_the_calls_stop_slowing_and_fillers_keep_a_power_limited_gpu_busy():
    """The rules that keep a GPU under sustained load around timed calls (the calls themselves run only on a GPU;
    here a fake clock, scripted call times and scripted NVML readings stand in for them)."""
    from types import SimpleNamespace

    from ksearch_graph import _candidate_runner as rl

    rl.load_torch()
    timer = rl.Timer("cpu")
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
        nvml.at_limit = lambda w, share=rl.POWER_LIMITED: (bool(limited) and w > 200.0) or (
            first_change and w == 201.0) or (share < rl.POWER_LIMITED and near and w > 200.0)
        timer.heat(None, (), first=first)
        return clock[0]

    timer.perf = lambda: clock[0]
    timer.back_to_back = back_to_back
    timer.gauge = nvml
    window = rl.HEAT_WINDOW_S
    # A process's first heat, power-limited: at least FIRST_HEAT_MIN_S however flat (a cool GPU throttles late).
    assert rl.FIRST_HEAT_MIN_S <= heat() <= rl.FIRST_HEAT_MIN_S + 2 * window and timer.limited
    # A later workload, power-limited: at least HEAT_MIN_S, then until a window is no slower than the one before.
    rising = round(rl.HEAT_MIN_S / window) + 2  # windows still slowing down after HEAT_MIN_S
    assert heat(times=[100 + 4 * i for i in range(rising)] + [100 + 4 * rising - 3.5]) == pytest.approx(
        (rising + 1) * window)
    assert rl.HEAT_MAX_S <= heat(times=[100 + 5 * i for i in range(100)]) <= rl.HEAT_MAX_S + window
    # Not power-limited: a few windows; no fillers afterwards.
    assert heat(limited=False) == pytest.approx(rl.UNLIMITED_HEAT_WINDOWS[0] * window) and not timer.limited
    asked.clear()
    timer.fill(None, (), gap_s=1e-3, call_us=1000.0)
    assert asked == []
    # NVML at top clock, but the calls keep slowing down under their own load, by more than LOAD_SLOWDOWN after the
    # first window: limited too (a heat ends after two windows only if the second is no slower than the first).
    assert heat(times=[95.0, 97.0, 99.0, 101.0], limited=False) >= rl.HEAT_MIN_S and timer.limited
    assert timer.limited_by == "slowdown"
    assert heat(times=[95.0, 97.0, 98.0, 98.5], limited=False) < rl.HEAT_MIN_S and not timer.limited
    # The same slowdown with the power far below the cap (a few-us kernel's windows move by 3% without it, session
    # 10): not limited. Without a power reading in the driver, the slowdown decides.
    assert heat(times=[95.0, 97.0, 99.0, 101.0], limited=False, near=False) < rl.HEAT_MIN_S
    assert not timer.limited and timer.limited_by is None
    assert heat(times=[95.0, 97.0, 99.0, 101.0], limited=False, held=False, power=False) >= rl.HEAT_MIN_S
    assert timer.limited_by == "slowdown"
    # Only the readings that count say how near the cap the GPU is: a first refresh near it (it may cover the previous
    # workload) does not make a slowdown count; a slowdown before the first counted reading counts once one is near.
    assert heat(times=[95.0, 97.0, 99.0, 101.0], limited=False, near=False, first_change=True, period=4) < rl.HEAT_MIN_S
    assert not timer.limited
    slowing = [95.0, 97.0, 99.0, 101.0] + [101.0] * 4
    assert heat(times=slowing, limited=False, stale_windows=5) >= rl.HEAT_MIN_S and timer.limited_by == "slowdown"
    assert heat(times=slowing, limited=False, stale_windows=5, near=False) < rl.HEAT_MIN_S and not timer.limited
    # Not limited, but NVML's power reading stays what it was before the heat for 5 windows: the heat waits for one
    # from within the heat (its second change: the seventh window's).
    assert heat(limited=False, stale_windows=5) == pytest.approx(7 * window) and not timer.limited
    # Power at the limit only in the first changed reading (which may cover the previous workload): not counted,
    # however many windows read it before the next refresh (the fifth window's, with one every 4 reads).
    assert heat(limited=False, first_change=True) == pytest.approx(2 * window) and not timer.limited
    assert heat(limited=False, first_change=True, period=4) == pytest.approx(5 * window) and not timer.limited
    # The clock held below top (it lags: the previous workload's cap) but fresh power readings well below the limit:
    # not limited. Without a power reading in the driver, the clock decides.
    assert heat(limited=False, held=True) == pytest.approx(rl.UNLIMITED_HEAT_WINDOWS[0] * window)
    assert not timer.limited
    assert heat(limited=False, held=True, power=False) >= rl.HEAT_MIN_S and timer.limited
    # A power query that fails now and then (the driver has the field): those windows are skipped, the clock is not
    # asked instead.
    assert heat(limited=False, held=True, failed={1, 2}, stale_windows=2) == pytest.approx(4 * window)
    assert not timer.limited
    assert heat(limited=False, power=False) == pytest.approx(rl.UNLIMITED_HEAT_WINDOWS[0] * window)
    assert not timer.limited
    # Clock at top, but a fresh power reading at the limit: limited (it reads early, before the clock drops).
    assert heat(limited=True, held=False) >= rl.HEAT_MIN_S and timer.limited and timer.limited_by == "power"
    # No fresh reading within HEAT_MAX_S, or no NVML at all: the safe side, power-limited.
    assert heat(limited=None) >= rl.HEAT_MAX_S and timer.limited and timer.limited_by == "no power reading"
    nvml.available = False
    assert heat(limited=False) >= rl.HEAT_MIN_S and timer.limited and timer.limited_by == "no NVML"
    nvml.available = True
    asked.clear()
    timer.heat(None, (), first=False)  # a later burst of the same workload, power-limited: the GPU idled meanwhile
    assert asked == [rl.HEAT_MIN_S] and timer.limited
    timer.limited = False
    asked.clear()
    timer.heat(None, (), first=False)  # not power-limited: a short heat
    assert asked == [rl.HEAT_S] and not timer.limited
    timer.limited = True
    # Fillers: enough that calls fill FILL_DUTY of the time, at most FILL_MAX x the timed call.
    asked.clear()
    timer.fill(None, (), gap_s=0.0, call_us=100.0)  # nothing else between calls: no fillers
    timer.fill(None, (), gap_s=50e-6, call_us=1000.0)
    assert asked == []
    timer.fill(None, (), gap_s=1e-3, call_us=1000.0)
    want = min(rl.FILL_DUTY / (1 - rl.FILL_DUTY) * 1e-3 - 1e-3, rl.FILL_MAX * 1e-3)
    assert asked == [pytest.approx(want)] and want > 0
    # A fresh process's first heat, not power-limited: more windows than later ones (the GPU may be cool).
    timer.heated = False
    assert heat(limited=False) == pytest.approx(rl.UNLIMITED_HEAT_WINDOWS[1] * window)


def test_the_power_gauge_reads_nvmls_power_clock_and_reasons():
    """PowerGauge's side of NVML through ctypes, against a fake libnvidia-ml that writes what the real one would:
    the instantaneous power as any of nvmlValue_t's types, failed queries as None, the clock or a power-cap reason
    as held."""
    import ctypes
    from types import SimpleNamespace

    from ksearch_graph import _candidate_runner as rl

    now = {"mhz": 1980, "reasons": 0x0, "field": (1, 812_000), "field_return": 0, "call_return": 0}

    def field_values(handle, count, ref):
        field = ref._obj
        assert count == 1 and field.fieldId == rl.PowerGauge.POWER_INSTANT
        kind, value = now["field"]
        field.valueType, field.nvmlReturn = kind, now["field_return"]
        setattr(field.value, rl.NvmlValue.KINDS[kind], value)
        return now["call_return"]

    def clock(handle, which, ref):
        ref._obj.value = now["mhz"]
        return 0

    def reasons(handle, ref):
        ref._obj.value = now["reasons"]
        return 0

    gauge = rl.PowerGauge(None)  # no PCI bus id: NVML not opened
    assert not gauge.available and not gauge.has_power
    gauge.lib = SimpleNamespace(nvmlDeviceGetClockInfo=clock)
    gauge.top, gauge.limit_mw, gauge.reasons, gauge.field_values = 1980, 700_000, reasons, field_values
    assert gauge.read() == (False, 812.0) and gauge.at_limit(812.0)
    assert ctypes.sizeof(rl.NvmlField) == 40  # nvml.h's layout: 4 + 4 + 8 + 8 + 4 + 4 + 8
    now["field"] = (0, 664.5e3)  # a double
    assert gauge.power() == 664.5 and not gauge.at_limit(664.5) and gauge.at_limit(665.0)  # 95% of 700 W
    now["field_return"] = 3  # NVML_ERROR_NOT_SUPPORTED in the field
    assert gauge.power() is None
    now["field_return"], now["call_return"] = 0, 999
    assert gauge.power() is None
    now["call_return"] = 0
    gauge.limit_mw = 0  # no enforced limit to compare with
    assert gauge.power() is None
    gauge.limit_mw = 700_000
    now["mhz"] = 1500
    assert gauge.read()[0]
    now["mhz"], now["reasons"] = 1980, 0x4  # the software power cap
    assert gauge.read()[0]
    now["reasons"] = 0x1  # idle: not held
    assert not gauge.read()[0]


def test_the_garbage_collector_is_off_from_the_probe_to_the_idle_event_and_back_on_after():
    """A collection inside a timed call read as device time on an H200 (session 11: a 32 us matmul timed 101-188 us,
    and tails the escape check charged). Fake CUDA calls log whether the collector is on at each step."""
    import gc

    from ksearch_graph import _candidate_runner as rl

    rl.load_torch()
    timer = rl.Timer("cpu")
    timer.cuda, timer.runtime, seen = True, None, []
    timer.idle_gap_us = lambda: seen.append(("probe", gc.isenabled())) or 0.0
    timer.cover = lambda: seen.append(("cover", gc.isenabled()))
    timer.Event = lambda enable_timing=False: object()
    timer.record = lambda event: None
    timer.event_sync = lambda event: seen.append(("idle", gc.isenabled()))
    timer.sync = lambda: None
    timer.elapsed = lambda a, b: 0.01
    gc.enable()
    try:
        timer.time(lambda: seen.append(("call", gc.isenabled())), ())
        assert seen == [("probe", False), ("probe", False), ("cover", False), ("call", False), ("idle", False)]
        assert gc.isenabled()

        def fails():
            raise RuntimeError("the candidate's")

        with pytest.raises(RuntimeError):
            timer.time(fails, ())
        assert gc.isenabled()  # back on after a call that raised

        # time_and_copy keeps it off through the output's copy too: a collection there would run gc.callbacks
        seen.clear()
        real_snapshot = rl.snapshot
        rl.snapshot = lambda out, sync: seen.append(("copy", gc.isenabled())) or out
        try:
            assert timer.time_and_copy(lambda: 7, ())[0] == 7
        finally:
            rl.snapshot = real_snapshot
        assert seen[-1] == ("copy", False) and gc.isenabled()

        gc.disable()  # a process that had it off (the candidate's choice) keeps it off
        timer.time(lambda: None, ())
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_hook_installed_while_the_harness_waits_for_the_device_is_found():
    """The wait for the device releases the GIL, so a thread of the candidate's can install a hook after the check
    right behind the call; the fake synchronize plays that thread (a gc callback, the collector turned on). The
    check after the output's copy finds both, and removes the callback."""
    import gc

    from ksearch_graph import _candidate_runner as rl

    torch = rl.load_torch()
    timer = rl.Timer("cpu")
    timer.cuda, timer.runtime = True, None
    timer.idle_gap_us = lambda: 0.0
    timer.cover = lambda: None
    timer.Event = lambda enable_timing=False: object()
    timer.record = timer.event_sync = lambda event: None
    timer.elapsed = lambda a, b: 0.01
    timer.hooks = rl.InterpreterHooks()

    def callback(phase, info):
        pass

    def a_thread_acts():
        if callback not in gc.callbacks:
            gc.callbacks.append(callback)
        gc.enable()

    timer.sync = a_thread_acts
    try:
        out = timer.time_and_copy(lambda: torch.ones(3), ())[0]
        assert torch.equal(out, torch.ones(3))
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
from ksearch_graph import _candidate_runner as rl
torch = rl.load_torch()
patches = rl.LibraryPatches()
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
patches = rl.LibraryPatches(task)
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


def test_a_timed_call_follows_the_probe_and_the_launch_cover_and_fillers_run_before_the_next_inputs_exist():
    """The order that keeps the checks sound: the idle-device probe, then the launch cover (the L2 flush, then the
    hold), then the call; untimed calls of the candidate (fillers) before the next call's inputs are made, so its
    code never runs while they exist (tests/cheats/work_ahead.py). Fake CUDA calls and a fake burst log the order."""
    from ksearch_graph import _candidate_runner as rl

    rl.load_torch()
    timer = rl.Timer("cpu")
    timer.cuda, timer.runtime, log = True, None, []
    timer.idle_gap_us = lambda: log.append("probe") or 0.0
    timer.cover = lambda: log.append("cover")
    timer.Event = lambda enable_timing=False: object()
    timer.record = timer.event_sync = lambda event: None
    timer.sync = lambda: log.append("sync")
    timer.elapsed = lambda a, b: 0.01
    timer.time(lambda: log.append("call"), ())
    assert log[:5] == ["probe", "probe", "cover", "call", "sync"]  # the shorter of two probes (Timer.time)

    class Burst:  # stands in for the Timer in timed_burst
        perf = staticmethod(lambda: 1.0)
        sync = staticmethod(lambda: None)

        def fill(self, fn, args, gap_s, call_us):
            log.append("fill")

        def reserve_small_blocks(self, held, count):
            log.append(f"reserve {count} x {held}")

        def time_and_copy(self, fn, args):
            log.append("time")
            return None, 5.0, 0.0, 0.0, 6.0

    def next_call(k):
        log.append(f"inputs {k}")
        return None, ()

    log.clear()
    rl.timed_burst(Burst(), 3, next_call, filler=(None, ("heat args",)))
    assert log == ["reserve 3 x ('heat args',)", "inputs 0", "time", "fill", "inputs 1", "time", "fill", "inputs 2",
                   "time"]
    log.clear()  # a module task's call holds its whole inputs (the state dict too), not only the forward arguments
    rl.timed_burst(Burst(), 1, next_call, filler=(None, ("forward",)), held=("init", {"w": 1}, "forward"))
    assert log == ["reserve 1 x ('init', {'w': 1}, 'forward')", "inputs 0", "time"]


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_no_call_of_a_burst_gets_a_segment_from_the_driver():
    """A burst holds every call's inputs and output copy for the judge's checks, so torch's caching allocator ran out
    of small blocks about once a burst, and the candidate's output came from a cudaMalloc inside its timed call,
    which waits for the launch cover (a 32 us matmul read ~300 us, session 12). Timer.reserve_small_blocks makes the
    burst's small blocks before its first call: no call after the heat, timed or filler, needs a new segment."""
    from ksearch_graph import _candidate_runner as rl

    torch = rl.load_torch()
    if torch.cuda.get_allocator_backend() != "native":
        pytest.skip("counts the native caching allocator's segments")
    timer = rl.Timer("cuda")
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
    done = rl.timed_burst(timer, 40, lambda k: (call, (torch.randn(16, 4096, device="cuda"),)),
                          filler=(call, heat_args))
    assert len(done) == 40 and all(isinstance(out, torch.Tensor) for out, *_ in done)
    assert len(new_segments) >= 40 and sum(new_segments) == 0, new_segments


COMPILE_THE_COVER = """
import json, re, subprocess, sys
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ksearch_graph import _launch_cover as cover

source = ASTSource(fn=cover._flush_then_hold, constexprs={"BLOCK": cover.BLOCK},
                   signature={"words": "*i64", "n": "i32", "per_block": "i32", "hold_ns": "i32", "BLOCK": "constexpr"})
kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": cover.THREADS // 32})
cubin = Path(sys.argv[1]) / "cover.cubin"
cubin.write_bytes(kernel.asm["cubin"])
tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
usage = subprocess.run([str(tool), "--dump-resource-usage", str(cubin)], capture_output=True, text=True,
                       check=True).stdout
print(json.dumps({"timer": "%globaltimer" in kernel.asm["ptx"], "threads": cover.THREADS, "usage": usage,
                  **{key: int(re.search(key + r":(\\d+)", usage).group(1)) for key in ("REG", "SHARED")}}))
"""


def test_the_launch_cover_fills_every_sm_of_hopper_and_ada_gpus(tmp_path):
    """The launch cover (ksearch_graph/_launch_cover.py), compiled for sm_90 without a GPU, with the argument types it
    runs with: it reads the GPU's nanosecond timer, uses no shared memory and few enough registers that its blocks
    fill every thread slot of an SM of 2048 threads (Hopper) or 1536 (Ada), so no other kernel can place a block
    beside it while it holds (what keeps work on another stream from starting before the timed call's start event:
    tests/cheats/overlap_cover.py, and the GPU test below). In a child process: compiling for a GPU here would leave
    Triton's state unfit for the interpreter the task tests use."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", COMPILE_THE_COVER, str(tmp_path)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["timer"] and got["SHARED"] == 0 and got["REG"] * 2048 <= 65536, got["usage"]  # 64K registers per SM
    assert 2048 % got["threads"] == 0 and 1536 % got["threads"] == 0


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_the_launch_cover_holds_the_gpu_then_leaves_the_l2_flushed():
    """On a GPU: the Timer got the Triton cover, not the fallback; it lasts COVER_S; a kernel launched on a
    high-priority stream while it holds ends after it; and it zeroes the whole flush buffer."""
    from ksearch_graph import _candidate_runner as rl

    rl.load_torch()
    timer = rl.Timer("cuda")
    assert timer.cover_kind == "every SM held", timer.cover_kind
    timer.flush.fill_(1)
    x = torch.ones(1 << 20, device="cuda")
    side = torch.cuda.Stream(priority=-1)
    torch.cuda.synchronize()
    before, after, beside = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    before.record()
    timer.cover()
    after.record()
    with torch.cuda.stream(side):
        x.mul_(2)
        beside.record(side)
    torch.cuda.synchronize()
    assert before.elapsed_time(after) >= rl.COVER_S * 1e3 * 0.95
    assert after.elapsed_time(beside) >= 0, "a kernel on another stream finished while the cover held the GPU"
    assert int(timer.flush.count_nonzero()) == 0


def test_an_exit_during_timing_is_reported_with_the_candidates_traceback(tmp_path):
    """sys.exit from a timed call (inside a burst) is the candidate's error, shown to the LLM as such."""
    task = write_task(tmp_path / "task")
    source = "import sys\n\ncalls = []\n\n\ndef scale(x, alpha):\n    calls.append(1)\n    if len(calls) == 8:\n" \
             "        sys.exit(3)\n    return x * alpha\n"
    r = SubprocessEvaluator(timeout_s=120, time_budget_s=0.1, workloads="all").evaluate(
        task, {"kernel.py": source}, attempt_id="exit")
    assert r.status == Status.runtime_error and "SystemExit: 3" in r.log_excerpt and "kernel.py" in r.log_excerpt, \
        explain(r)


def test_a_timing_trace_has_every_timed_call_of_reference_and_candidate_and_the_candidate_never_sees_it(
        tmp_path, monkeypatch):
    """KSEARCH_TIMING_TRACE (for diagnosing the timing) gets each burst's calls from the judge; the candidate's process
    does not have the variable."""
    task = write_task(tmp_path / "task")
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("KSEARCH_TIMING_TRACE", str(trace))
    source = HONEST + "\n\nimport os\nassert 'KSEARCH_TIMING_TRACE' not in os.environ\n"
    r = SubprocessEvaluator(timeout_s=120, time_budget_s=0.1, workloads="all").evaluate(
        task, {"kernel.py": source}, attempt_id="traced")
    assert r.passed, explain(r)
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [line["at"] for line in lines] == sorted(line["at"] for line in lines)  # written as the bursts came
    for w in r.workloads:
        for who, runs in (("reference", None), ("candidate", w.runs)):
            calls = [c for line in lines if (line["who"], line["workload"]) == (who, w.workload)
                     and not line.get("dropped") for c in line["calls"]]
            assert len(calls) >= 3 and all(len(c) == 4 for c in calls), (who, w.workload, calls)
            if runs is not None:
                assert len(calls) == runs
                # The device times, or with the whole tail added where the escape check charged it (a GPU can
                # read a few us kernel's tails long while another process uses it).
                assert w.latency_us in (pytest.approx(statistics.fmean(c[0] for c in calls), rel=1e-3),
                                        pytest.approx(statistics.fmean(c[0] + c[1] for c in calls), rel=1e-3))

    # A path that cannot be written turns the trace off; the evaluation goes on.
    monkeypatch.setenv("KSEARCH_TIMING_TRACE", str(tmp_path / "no-such-folder" / "trace.jsonl"))
    r = SubprocessEvaluator(timeout_s=120, time_budget_s=0.1, workloads="all").evaluate(
        task, {"kernel.py": source}, attempt_id="untraced")
    assert r.passed, explain(r)


def test_reference_timings_are_measured_once_per_session(tmp_path):
    """The evaluator times the reference and baseline in its first evaluation, before any candidate code runs, and
    reuses the figures, also after a candidate that failed: every candidate is compared with the same numbers. An
    edited reference, or reuse switched off, is timed again."""
    (tmp_path / "baseline.py").write_text("import torch\n\n\ndef scale(x, alpha):\n    return torch.mul(x, alpha)\n")
    task = write_task(tmp_path, baseline="baseline.py")
    files = {"kernel.py": HONEST}
    ev = SubprocessEvaluator(timeout_s=120, time_budget_s=0.1, workloads="all")
    failed = ev.evaluate(task, {"kernel.py": "def scale(x, alpha):\n    return x\n"}, attempt_id="wrong")
    assert failed.status == Status.incorrect_numerical, explain(failed)
    first, second = (ev.evaluate(task, files, attempt_id=f"reuse{i}") for i in range(2))
    assert first.passed and second.passed, (explain(first), explain(second))
    for r in (first, second):
        assert r.environment["reference_timing"] == "2 of 2 workloads reused from an earlier evaluation on this GPU"
    for a, b in zip(first.workloads, second.workloads):
        assert (a.reference_us, a.baseline_us) == (b.reference_us, b.baseline_us)
        assert a.latency_us != b.latency_us  # the candidate itself is timed every time
    assert "reference_timings" not in second.model_dump()  # plumbing, not part of the record

    (tmp_path / "reference.py").write_text(SCALE_REFERENCE + "\n# edited\n")
    edited = ev.evaluate(load_task(tmp_path), files, attempt_id="edited")
    assert edited.environment["reference_timing"] == "measured in this evaluation"
    assert edited.phases["reference_timing"] > 0 and second.phases["reference_timing"] == 0

    never = SubprocessEvaluator(timeout_s=120, time_budget_s=0.1, workloads="all", reuse_reference_timings_s=0)
    for i in range(2):
        r = never.evaluate(task, files, attempt_id=f"never{i}")
        assert r.environment["reference_timing"] == "measured in this evaluation", explain(r)


def test_prestarted_evaluations_are_fresh_processes_whose_imports_cost_nothing(tmp_path):
    """With prestart an evaluation's processes start (and import torch) on start_ahead() (a search calls it as it
    starts) and as soon as one evaluation ends; the next evaluate() hands them the job. A prestarted pair that died
    is replaced; close() leaves nothing behind."""
    task = write_task(tmp_path / "task")
    work = tmp_path / "work"
    ev = SubprocessEvaluator(timeout_s=120, time_budget_s=0.1, workloads="all", prestart=True, workdir=str(work))
    files = {"kernel.py": HONEST}

    def standby():
        assert ev.wait_until_prestarted(timeout_s=120), "the prestarted evaluation never got ready"
        return ev._standby[0]

    assert not ev._standby  # making an evaluator starts nothing
    ev.start_ahead()
    waiting = standby()  # a search's first LLM turn covers its imports
    first = ev.evaluate(task, files, attempt_id="p0")
    assert first.passed and first.environment["prestarted"] is True and first.phases["imports"] == 0.0, explain(first)
    assert waiting.proc.returncode is not None and not waiting.root.exists()  # used once, then gone

    os.killpg(standby().proc.pid, signal.SIGKILL)  # the next pair dies before its job comes
    second = ev.evaluate(task, files, attempt_id="p1")
    assert second.passed and not second.environment.get("prestarted"), explain(second)
    assert first.phases["startup"] < second.phases["startup"]

    standby()
    third = ev.evaluate(task, files, attempt_id="p2")
    assert third.passed and third.environment["prestarted"] is True, explain(third)

    ev.close()
    assert not ev._standby and list(work.iterdir()) == []
    assert str(work) not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


def test_a_search_on_a_gpu_host_starts_its_first_evaluations_processes_as_it_starts(monkeypatch, tmp_path):
    """The evaluator a search makes for itself prestarts on a GPU host, before the first candidate exists, and
    those processes time the search's task's reference while they wait."""
    from ksearch_graph import context, evaluation
    from ksearch_graph.config import SearchConfig

    task = write_task(tmp_path / "task")
    monkeypatch.setattr(evaluation, "gpu_driver_present", lambda: True)
    ev = context.default_evaluator(SearchConfig(), task)
    try:
        assert ev.prestart and len(ev._standby) == 1 and ev._standby[0].proc.poll() is None
        assert ev.wait_until_prestarted(timeout_s=120)
        assert "reference timed ahead: 2 workloads" in (ev._standby[0].root / "stderr.txt").read_text()
    finally:
        ev.close()
    assert not ev._standby


def test_the_first_evaluation_finds_its_reference_timed_while_its_processes_waited(tmp_path):
    """start_ahead(task): the prestarted processes time the reference while the LLM would be writing the first
    candidate, so the first evaluation pays nothing for it; the figures are kept and reused as any evaluation's.
    A job that comes before that timing is done gets its clock started when it came, and times the rest itself;
    a job for another task does not use them."""
    task = write_task(tmp_path / "task")
    ev = SubprocessEvaluator(timeout_s=120, time_budget_s=0.1, workloads="all", prestart=True)
    files = {"kernel.py": HONEST}
    try:
        ev.start_ahead(task)
        assert ev.wait_until_prestarted(timeout_s=120)
        first = ev.evaluate(task, files, attempt_id="ahead")
        assert first.passed, explain(first)
        assert first.environment["reference_timing"] == "measured while its processes waited for the job"
        assert first.phases["reference_timing"] == 0.0
        second = ev.evaluate(task, files, attempt_id="after")  # its standby timed nothing: the figures exist
        assert second.environment["reference_timing"] == "2 of 2 workloads reused from an earlier evaluation on " \
            "this GPU", explain(second)
        assert [w.reference_us for w in first.workloads] == [w.reference_us for w in second.workloads]
    finally:
        ev.close()

    other = write_task(tmp_path / "other")
    for job_task, expected in ((task, None), (other, "measured in this evaluation")):
        ev = SubprocessEvaluator(timeout_s=120, time_budget_s=0.1, workloads="all", prestart=True)
        try:
            ev.start_ahead(task)  # no wait: the job may come while the reference is being timed
            r = ev.evaluate(job_task, files, attempt_id="early")
            assert r.passed and all(w.reference_us for w in r.workloads if w.timed), explain(r)
            assert expected in (None, r.environment["reference_timing"]), explain(r)
        finally:
            ev.close()


# make_inputs that sleeps while a file named "hold" exists beside it: a reference timing caught in the act.
HELD_REFERENCE = SCALE_REFERENCE.replace("def make_inputs(params, seed, device):\n", """\
def make_inputs(params, seed, device):
    import os, time
    hold = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hold")
    while os.path.exists(hold):
        time.sleep(0.05)
""")


def wait_for_line(ev: SubprocessEvaluator, text: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ev._standby and text in (ev._standby[0].root / "stderr.txt").read_text(errors="replace"):
            return
        time.sleep(0.05)
    raise AssertionError(f"the prestarted evaluation never said {text!r}")


def test_a_job_that_comes_during_the_reference_timing_ahead_pays_the_rest_on_its_clock(tmp_path):
    """The job comes while the waiting judge is in the middle of timing the reference: the time it waits for that
    workload is on its clock and reported as reference timing. A standby killed there (no candidate code has run)
    is replaced by fresh processes, as one killed while waiting is."""
    task_dir = tmp_path / "task"
    task_dir.mkdir()
    (task_dir / "reference.py").write_text(HELD_REFERENCE)
    task = write_task(task_dir)
    hold = task_dir / "hold"
    files = {"kernel.py": HONEST}

    ev = SubprocessEvaluator(timeout_s=120, time_budget_s=0.1, workloads="all", prestart=True)
    try:
        hold.touch()
        ev.start_ahead(task)
        wait_for_line(ev, "reference timing small")
        threading.Timer(1.5, hold.unlink).start()  # the job is sent now, the timing goes on 1.5 s later
        r = ev.evaluate(task, files, attempt_id="during")
        assert r.passed and r.environment["prestarted"] is True, explain(r)
        assert r.phases["reference_timing"] >= 1.0 and r.wall_s >= r.phases["reference_timing"], explain(r)

        ev.close()  # the next standby, without timings kept: one that times the reference ahead again
        ev._timings.clear()
        hold.touch()
        ev.start_ahead(task)
        wait_for_line(ev, "reference timing small")
        os.killpg(ev._standby[0].proc.pid, signal.SIGKILL)
        hold.unlink()
        again = ev.evaluate(task, files, attempt_id="killed")
        assert again.passed and not again.environment.get("prestarted"), explain(again)
    finally:
        ev.close()
        hold.unlink(missing_ok=True)


def test_reference_timings_are_kept_from_when_they_were_measured():
    """A prestarted process may wait long for its job after timing the reference: its figures expire counted from
    when it measured them."""
    ev = SubprocessEvaluator(timeout_s=120, reuse_reference_timings_s=600)
    slot = ("/task", None)
    now = time.time()
    ev._keep_timings(slot, {"key": "k", "workloads": {"old": {"params": {}, "reference": {}, "at": now - 900},
                                                       "new": {"params": {}, "reference": {}, "at": now - 10},
                                                       "unstamped": {"params": {}, "reference": {}}}})
    assert set(ev._reusable_timings(slot)["workloads"]) == {"new", "unstamped"}


@pytest.mark.parametrize("job, message", [("not json", "not valid JSON"), ('{"workloads": ""}', "names no task")])
def test_a_malformed_job_is_reported_in_the_result(tmp_path, job, message):
    """The judge started ahead of its job writes a result saying what was wrong with the job, not nothing."""
    (tmp_path / "candidate").mkdir()
    out = tmp_path / "result.json"
    child = Path(__file__).resolve().parents[1] / "ksearch_graph" / "_evaluate_child.py"
    proc = subprocess.run([sys.executable, str(child), "--job-from-stdin", "--candidate", str(tmp_path / "candidate"),
                           "--out", str(out)], input=job, text=True, capture_output=True, timeout=120,
                          env=dict(os.environ, TMPDIR=str(tmp_path)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = EvalResult.model_validate_json(out.read_text())
    assert r.status == Status.runtime_error and message in r.log_excerpt, explain(r)


@pytest.mark.skipif(CUDA, reason="checks the CPU-only answer")
def test_cuda_languages_are_unavailable_without_a_gpu(results):
    r = results["cupy_on_cpu"]
    assert r.status == Status.unavailable and "no CUDA GPU" in r.log_excerpt


# --- GPU: CUDA C++ through CuPy (NVRTC) and torch extensions; crashes leave the GPU usable --------------------------

CUPY_KERNEL = '''
import cupy
import torch

SOURCE = r"""
extern "C" __global__ void scale(const float* x, float alpha, float* y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * alpha;%s
}
"""
module = cupy.RawModule(code=SOURCE)


def scale(x, alpha):
    y = torch.empty_like(x)
    n = x.numel()
    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    with stream:
        module.get_function("scale")(((n + 255) // 256,), (256,),
                                     (cupy.uint64(x.data_ptr()), cupy.float32(alpha), cupy.uint64(y.data_ptr()), cupy.int64(n)))
    return y
'''

EXTENSION_CU = r'''
#include "kernel.h"
#include <ATen/cuda/CUDAContext.h>

__global__ void scale_kernel(const float* x, float alpha, float* y, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * alpha;%s
}

torch::Tensor scale(torch::Tensor x, double alpha) {
    auto y = torch::empty_like(x);
    int64_t n = x.numel();
    scale_kernel<<<(n + 255) / 256, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), (float)alpha, y.data_ptr<float>(), n);
    return y;
}
'''
EXTENSION_H = "#pragma once\n#include <torch/extension.h>\ntorch::Tensor scale(torch::Tensor x, double alpha);\n"
EXTENSION_MAIN = '#include "kernel.h"\n\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("scale", &scale); }\n'

ILLEGAL_ACCESS = CUPY_KERNEL % "\n    if (i == 0) { float* far = (float*)0x10; *far = 1.0f; }"


def extension(body_extra: str = "") -> dict[str, str]:
    return {"kernel.cu": EXTENSION_CU % body_extra, "kernel.h": EXTENSION_H, "main.cpp": EXTENSION_MAIN}


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_the_heat_tells_a_power_limited_kernel_from_a_light_one_through_nvml():
    """NVML through the driver's library (clock, clock-event reasons, instantaneous power): small multiplies back to
    back leave the GPU far below its power limit; an 8192^3 bf16 matmul drives an H200 past it (792-872 W of 700 in
    session 8) before its clock drops; a 256M fp32 scale (about 560 W) does not."""
    from ksearch_graph import _candidate_runner as rl

    rl.load_torch()
    timer = rl.Timer("cuda")
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
    assert heats["scale 256M fp32"][1] < rl.HEAT_MAX_S, f"no refreshed power reading in the heat: {heats}"


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_cuda_cpp_through_cupy_and_torch_extensions(tmp_path):
    base = tmp_path / "cuda_task"
    task = write_task(base, language="cupy", allowed_languages=["cupy", "cuda", "pytorch"],
                      workloads=[{"name": "n1M", "params": {"n": 1 << 20}}, {"name": "odd", "params": {"n": 12345}}])
    ev = SubprocessEvaluator(timeout_s=600, time_budget_s=0.2, cache_dir=str(tmp_path / "cache"))
    cupy_first = ev.evaluate(task, {"kernel.py": CUPY_KERNEL % ""}, attempt_id="cupy-1")
    cupy_cached = ev.evaluate(task, {"kernel.py": CUPY_KERNEL % ""}, attempt_id="cupy-2")
    cupy_broken = ev.evaluate(task, {"kernel.py": CUPY_KERNEL % "\n    undeclared_name = 1;"}, attempt_id="cupy-3")
    ext_first = ev.evaluate(task, extension(), attempt_id="ext-1")
    ext_cached = ev.evaluate(task, extension(), attempt_id="ext-2")
    ext_broken = ev.evaluate(task, extension("\n    this is not C++;"), attempt_id="ext-3")
    for r in (cupy_first, cupy_cached, ext_first, ext_cached):
        assert r.status == Status.passed, explain(r)
    assert cupy_broken.status == Status.compile_error and "undeclared_name" in cupy_broken.log_excerpt, explain(cupy_broken)
    assert ext_broken.status == Status.compile_error and "error" in ext_broken.log_excerpt, explain(ext_broken)
    # The build is cached by source hash: the second evaluation of the same extension does not rebuild it.
    assert ext_first.compile_s > 5 and ext_cached.compile_s < ext_first.compile_s / 3, (ext_first.compile_s,
                                                                                        ext_cached.compile_s)
    assert cupy_cached.compile_s <= cupy_first.compile_s + 0.5  # NVRTC output cached by CuPy (small either way)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_illegal_memory_access_and_oom_leave_the_gpu_healthy(tmp_path):
    task = write_task(tmp_path / "crash_task", language="cupy", allowed_languages=["cupy", "pytorch"])
    ev = SubprocessEvaluator(timeout_s=300, time_budget_s=0.1)
    crash = ev.evaluate(task, {"kernel.py": ILLEGAL_ACCESS}, attempt_id="illegal")
    assert crash.status == Status.runtime_error, explain(crash)
    assert "illegal" in crash.log_excerpt.lower() or "CUDA" in crash.log_excerpt, explain(crash)
    assert crash.environment.get("gpu_healthy_after") is True
    oom = ev.evaluate(task, {"kernel.py": "import torch\n\n\ndef scale(x, alpha):\n"
                                          "    torch.empty(1 << 44, device='cuda')\n    return x * alpha\n"},
                      attempt_id="oom")
    assert oom.status == Status.runtime_error and "out of memory" in oom.log_excerpt.lower(), explain(oom)
    after = ev.evaluate(task, {"kernel.py": HONEST}, attempt_id="after")
    assert after.status == Status.passed, explain(after)
