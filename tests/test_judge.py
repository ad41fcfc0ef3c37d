"""The judge end to end, through SubprocessEvaluator on small tasks written here: the judge/runner split (hostile
messages, patched input generation, network namespace), correctness-only workloads, baselines, KernelBench-style
module entry points, separate compile and call limits, reference timings reused and timed ahead, prestarted processes,
the timing trace, and, on a GPU, CUDA C++ through CuPy/NVRTC and torch extensions, and the GPU's health after an
illegal memory access. The planted cheats are in test_cheats.py; the softmax example's cases in test_evaluation.py."""

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

from ksearch_graph.harness.parent.client import SubprocessEvaluator
from ksearch_graph.tasks.evaluation import EvalResult, Status
from ksearch_graph.tasks.task import Task, load_task

CUDA = torch.cuda.is_available()

pytestmark = pytest.mark.slow  # every test here runs whole evaluations (two processes each)


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
import pickle
import socket
import sys


class Payload:
    def __reduce__(self):
        return (os.system, ("touch {marker}",))


# The import takes the harness's socket over and sends the judge a pickle that would run a command where unpickled.
fd = int(sys.argv[sys.argv.index("--fd") + 1])
socket.socket(fileno=os.dup(fd)).send(pickle.dumps(Payload()))


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
    return sys.modules["ksearch_task_reference"].reference(x, alpha)
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
    assert "replaced torch.randn" in r.log_excerpt  # the judge makes the inputs: it would change nothing else


def test_a_hostile_message_from_the_candidates_process_runs_nothing(results):
    r = results["hostile_pickle"]
    assert r.status == Status.suspicious, explain(r)
    assert "not a JSON message" in r.log_excerpt
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
            # The reference's [device, tail, probe, host, launch] us; the candidate's process adds its own Go-to-Done
            # time.
            assert len(calls) >= 3 and all(len(c) == (5 if who == "reference" else 6) for c in calls), (
                who, w.workload, calls)
            if runs is not None:
                assert len(calls) == runs
                # The device times, or with the whole tail added where the escape check charged it (a GPU can
                # read a few us kernel's tails long while another process uses it); calls the judge's clock
                # raised (a stalled host) are named in the log and only ever raise the mean.
                raised = f"{w.workload}: " in r.log_excerpt and "counted at what it leaves" in r.log_excerpt
                assert w.latency_us in (pytest.approx(statistics.fmean(c[0] for c in calls), rel=1e-3),
                                        pytest.approx(statistics.fmean(c[0] + c[1] for c in calls), rel=1e-3)) or (
                    raised and w.latency_us > statistics.fmean(c[0] for c in calls)), explain(r)

    # A path that cannot be written turns the trace off; the evaluation goes on.
    monkeypatch.setenv("KSEARCH_TIMING_TRACE", str(tmp_path / "no-such-folder" / "trace.jsonl"))
    r = SubprocessEvaluator(timeout_s=120, time_budget_s=0.1, workloads="all").evaluate(
        task, {"kernel.py": source}, attempt_id="untraced")
    assert r.passed, explain(r)


# A host busy through one burst, as the judge's clock sees it: in the candidate's process (where the runner's
# next_call makes each timed call's inputs) the first three timed calls' inputs come 40 ms late.
SLOW_FIRST_BURST = MODEL_NEW.replace('''    def __init__(self, features, hidden):
        super().__init__()''', '''    built = []

    def __init__(self, features, hidden):
        super().__init__()
        # Built once per call: 3 correctness calls, the warm-up, the heat, then the first burst's 3 timed calls,
        # whose construction (inside the judge's interval, outside the reported time) burns 40 ms of CPU each.
        ModelNew.built.append(1)
        if 6 <= len(ModelNew.built) <= 8:
            import time
            end = time.process_time() + 0.04
            while time.process_time() < end:
                pass''')


def test_a_burst_the_judges_clock_contradicts_once_is_timed_again(tasks, tmp_path):
    """time_bound.py: a burst whose calls the judge's clock finds far longer than reported is dropped and timed again
    once per workload (a busy host slows one burst; a forged clock lies again: tests/test_forgery.py). Here the
    candidate's module burns CPU while it is built for the first burst's calls: inside the judge's interval (the CPU
    time of its process tree), outside the call's reported time."""
    assert "built.append" in SLOW_FIRST_BURST
    trace = tmp_path / "trace.jsonl"
    ev = SubprocessEvaluator(timeout_s=120, time_budget_s=0.1, workloads="all",
                             env={"KSEARCH_TIMING_TRACE": str(trace)})
    r = ev.evaluate(tasks["module"], {"model_new.py": SLOW_FIRST_BURST}, attempt_id="one-slow-burst")
    assert r.passed, explain(r)
    assert "default: calls 1-3: the judge's clock leaves at least" in r.log_excerpt, explain(r)
    assert "dropped and timed again" in r.log_excerpt, explain(r)
    bursts = [json.loads(line) for line in trace.read_text().splitlines()]
    candidate = [b for b in bursts if b["who"] == "candidate"]
    assert candidate[0]["first"] == 0 and candidate[0]["dropped"]
    assert not any(b.get("dropped") for b in candidate[1:])
    assert r.workloads[0].runs == sum(len(b["calls"]) for b in candidate[1:])


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
    assert edited.passed, explain(edited)
    assert edited.environment["reference_timing"] == "measured in this evaluation"
    assert edited.phases["reference_timing"] > 0 and second.phases["reference_timing"] == 0

    never = SubprocessEvaluator(timeout_s=120, time_budget_s=0.1, workloads="all", reuse_reference_timings_s=0)
    for i in range(2):
        r = never.evaluate(task, files, attempt_id=f"never{i}")
        assert r.environment["reference_timing"] == "measured in this evaluation", explain(r)


def test_prestarted_evaluations_are_fresh_processes_whose_imports_cost_nothing(tmp_path):
    """With prestart an evaluation's processes start (and import torch) on start_ahead() (a search calls it as it
    starts) and as soon as an evaluation starts; the next evaluate() hands them the job. A prestarted pair that died
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
    assert second.phases["imports"] > 0.0  # a fresh pair pays its imports; the prestarted one did not (above)

    standby()
    third = ev.evaluate(task, files, attempt_id="p2")
    assert third.passed and third.environment["prestarted"] is True, explain(third)

    ev.close()
    assert not ev._standby and list(work.iterdir()) == []
    assert str(work) not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


def test_a_search_on_a_gpu_host_starts_its_first_evaluations_processes_as_it_starts(monkeypatch, tmp_path):
    """The evaluator a search makes for itself prestarts on a GPU host, before the first candidate exists, and
    those processes time the search's task's reference while they wait."""
    from ksearch_graph.config import SearchConfig
    from ksearch_graph.harness.parent import client
    from ksearch_graph.search import context

    task = write_task(tmp_path / "task")
    monkeypatch.setattr(client, "gpu_driver_present", lambda: True)
    pool = context.default_evaluator(SearchConfig(), task)
    ev = pool.slots[0].evaluator  # the search's evaluator is a pool; each slot's evaluator prestarts
    try:
        assert ev.prestart and len(ev._standby) == 1 and ev._standby[0].proc.poll() is None
        assert ev.wait_until_prestarted(timeout_s=120)
        assert "reference timed ahead: 2 workloads" in (ev._standby[0].root / "stderr.txt").read_text()
    finally:
        pool.close()
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
    child = Path(__file__).resolve().parents[1] / "ksearch_graph" / "harness" / "judge" / "judge.py"
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


def test_the_candidates_process_imports_no_harness_module_late():
    """The integrity snapshot is taken once the runner has imported what it uses; a harness module imported later
    (inside a function, on a torch extension's failed build, say) is a new attribute of its package, and the check
    calls an honest candidate suspicious. So no function of a module the runner loads imports one of ours."""
    import ast

    code = ("import json, sys; import ksearch_graph.harness.candidate.runner; "
            "print(json.dumps({m: getattr(sys.modules[m], '__file__', None) for m in sys.modules "
            "if m.startswith('ksearch_graph')}))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                       cwd=Path(__file__).resolve().parents[1]).stdout)
    late = []
    for name, path in loaded.items():
        if not path:
            continue
        tree = ast.parse(Path(path).read_text())
        for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom):
                    names = [node.module or ""]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                else:
                    continue
                if any(n.startswith("ksearch_graph") for n in names):
                    late.append(f"{name}.{fn.name} (line {node.lineno})")
    assert "ksearch_graph.harness.candidate.build_errors" in loaded
    assert not late, late


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


def test_inputs_too_large_for_the_judge_are_refused_before_they_exist(tmp_path):
    """A workload of 4 GiB inputs, judged under an 8 GB limit: the judge would hold three input sets (12 GiB). Sized
    on torch's meta device, it is `unavailable` with the figures, in seconds and without allocating them."""
    task = write_task(tmp_path / "huge", workloads=[{"name": "huge", "params": {"n": 1 << 30}}])
    started = time.monotonic()
    r = SubprocessEvaluator(timeout_s=120, memory_limit_gb=8).evaluate(task, {"kernel.py": HONEST}, attempt_id="h")
    assert r.status == Status.unavailable, r.log_excerpt
    assert "workload huge: one input set is 4.0 GiB" in r.log_excerpt and "judge's memory limit" in r.log_excerpt
    assert time.monotonic() - started < 60
