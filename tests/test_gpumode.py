"""GPU MODE problems as tasks: a problem folder of our own in the reference-kernels layout
(tests/data/gpumode/linear: a linear layer whose `nobias` flag goes through upstream's spec parser) becomes a task
whose inputs are upstream's, and real evaluations on CPU judge GPU MODE submissions as upstream does."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, FakeOpenAIServer, Reply, insert, run_cli, script

from ksearch_graph.gpumode import SEED_FILE, materialise_gpumode, upstream_args
from ksearch_graph.task import TaskError, load_task

PROBLEM = REPO / "tests" / "data" / "gpumode" / "linear"
TOOL = REPO / "tools" / "evaluate_candidate.py"


@pytest.fixture(scope="module")
def task_folder(tmp_path_factory) -> Path:
    return materialise_gpumode(PROBLEM, tmp_path_factory.mktemp("gm") / "task")


def test_upstream_parser_keeps_false_as_a_truthy_string():
    spec = {"seqlen": 32, "seed": -7, "nomask": False, "nobias": True, "distribution": "normal"}
    assert upstream_args(spec, "t") == {"seqlen": 32, "seed": -7, "nomask": "False", "nobias": "True",
                                        "distribution": "normal"}
    for bad in ({"hidden_dim": 128}, {"scale": 0.5}, {"name": "two words"}):
        with pytest.raises(TaskError, match="upstream's eval.py rejects"):
            upstream_args(bad, "t")


def test_materialised_task(task_folder):
    task = load_task(task_folder)
    s = task.spec
    assert (s.entry_point, s.solution_file, s.seed_solution) == ("custom_kernel", "submission.py", SEED_FILE)
    assert (s.timing, s.compare_dtype, s.input_source, s.correctness_seeds) == ("end_to_end", "float32", "gpumode", 2)
    assert (s.tolerance.atol, s.tolerance.rtol) == (1e-2, 1e-2)  # make_match_reference(ref_kernel, rtol=, atol=)
    got = [(w.name, w.params, w.timed) for w in s.workloads]
    assert got == [
        ("test-00-m8-n16-k32-nobiasTrue", {"m": 8, "n": 16, "k": 32, "seed": 11, "nobias": "True"}, False),
        ("test-01-m8-n16-k32-nobiasFalse", {"m": 8, "n": 16, "k": 32, "seed": 12, "nobias": "False"}, False),
        ("test-02-m33-n17-k64-nobiasFalse", {"m": 33, "n": 17, "k": 64, "seed": 13, "nobias": "False"}, False),
        ("bench-00-m64-n64-k64-nobiasTrue", {"m": 64, "n": 64, "k": 64, "seed": 21, "nobias": "True"}, True),
        ("bench-01-m128-n64-k128-nobiasFalse", {"m": 128, "n": 64, "k": 128, "seed": 22, "nobias": "False"}, True),
    ]
    assert s.feedback_workloads == ["bench-00-m64-n64-k64-nobiasTrue", "bench-01-m128-n64-k128-nobiasFalse"]
    # The problem's files as task.yml lists them, not its evaluator, not the submission slot.
    assert sorted(p.name for p in (task_folder / "gpumode").iterdir()) == ["reference.py", "task.py", "task.yml",
                                                                           "utils.py"]
    assert task.seed_source == (PROBLEM / "submission.py").read_text()
    assert "def ref_kernel" in task.spec_text and '"False", which is truthy' in task.spec_text
    yaml_task = load_task(materialise_gpumode(PROBLEM, task_folder.parent / "yaml", args="yaml"))
    assert yaml_task.spec.workloads[1].params["nobias"] is False


def test_malformed_problems_say_what_is_wrong(tmp_path):
    def problem(reference: str, yml: str = "tests: []\nbenchmarks:\n  - {\"m\": 1, \"seed\": 1}\n") -> Path:
        folder = tmp_path / f"p{len(list(tmp_path.iterdir()))}"
        folder.mkdir()
        (folder / "task.yml").write_text(yml)
        (folder / "reference.py").write_text(reference)
        return folder

    base = "def ref_kernel(d): pass\ndef generate_input(m, seed): pass\n"
    cases = [
        (problem(base + "def check_implementation(d, o): pass\n"), "defines its own check_implementation"),
        (problem("def ref_kernel(d): pass\n"), "does not define generate_input"),
        (problem(base), "does not set check_implementation"),
        (problem(base + "check_implementation = make_match_reference(ref_kernel)\n", "tests: []\n"), "no benchmarks"),
        (problem(base + "check_implementation = make_match_reference(ref_kernel)\n",
                 "benchmarks:\n  - {\"hidden_dim\": 1}\n"), "rejects the spec part 'hidden_dim: 1'"),
    ]
    for folder, message in cases:
        with pytest.raises(TaskError, match=message):
            materialise_gpumode(folder, tmp_path / "out")
    ok = load_task(materialise_gpumode(problem(base + "check_implementation = make_match_reference(ref_kernel)\n"),
                                       tmp_path / "ok"))
    assert (ok.spec.tolerance.atol, ok.spec.tolerance.rtol) == (1e-8, 1e-5)  # upstream's defaults


def test_make_inputs_are_upstreams_on_the_public_seed(task_folder):
    """Seed 0 is the workload's own seed: exactly what upstream's generate_input(**args) makes, 'False' and all;
    any other seed is a hidden one. Run in a child: the generated reference registers `task` and `reference`."""
    code = f"""
import sys, torch
sys.path.insert(0, {str(PROBLEM)!r})
from reference import generate_input
sys.path.pop(0); [sys.modules.pop(m) for m in ("reference", "task", "utils")]
import importlib.util
spec = importlib.util.spec_from_file_location("made", {str(task_folder / "reference.py")!r})
made = importlib.util.module_from_spec(spec); spec.loader.exec_module(made)
params = {{"m": 8, "n": 16, "k": 32, "seed": 12, "nobias": "False"}}
(x, w, c), = made.make_inputs(params, 0, "cpu")
x2, w2, _ = generate_input(**params)
assert torch.equal(x, x2) and torch.equal(w["weight"], w2["weight"]) and c == {{"n": 16}}
assert torch.equal(w["bias"], torch.zeros(16))  # "False" is truthy: no bias, as upstream
(h, _, _), = made.make_inputs(params, 12345, "cpu")
(h2, _, _), = made.make_inputs(params, 12345, "cpu")
assert torch.equal(h, h2) and not torch.equal(h, x)
import task
assert task.__file__.startswith({str(task_folder)!r}) and hasattr(task, "input_t")
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO / "ksearch_graph")
    assert proc.stdout.strip() == "ok", proc.stderr


def test_workload_timed_at_0_us_falls_back_to_the_host_clock():
    from ksearch_graph.harness.timing import honest_times

    assert honest_times([0.0, 0.0, 0.0], [12.0, 13.0, 11.0]) == ([12.0, 13.0, 11.0], True)
    assert honest_times([0.0, 5.0], [12.0, 13.0]) == ([0.0, 5.0], False)


CANDIDATES = {
    # GPU MODE submissions as written for the leaderboard: `from task import ...`, any float dtype out.
    "template": (PROBLEM / "submission.py").read_text(),
    "float16_out": "import torch\nfrom task import input_t, output_t\n\ndef custom_kernel(data: input_t) -> output_t:\n"
                   "    x, w, _ = data\n    return (x.half() @ w['weight'].half().T + w['bias'].half())\n",
    # A prepared-weights cache in the input dict: flagged, judged and timed as usual.
    "dict_cache": "import torch\n\ndef custom_kernel(data):\n    x, w, _ = data\n"
                  "    if '_cache' not in w:\n        w['_cache'] = (w['weight'].T.contiguous(), object())\n"
                  "    return x @ w['_cache'][0] + w['bias']\n",
    # Ignoring the bias passes, as upstream: every `nobias` spec arrives as a truthy string.
    "ignores_bias": "def custom_kernel(data):\n    x, w, _ = data\n    return x @ w['weight'].T\n",
    "writes_weight": "def custom_kernel(data):\n    x, w, _ = data\n    w['weight'].mul_(1.0)\n"
                     "    w['bias'].add_(0.0)\n    w['weight'][0, 0] += 1\n    return x @ w['weight'].T + w['bias']\n",
    "replaces_weight": "def custom_kernel(data):\n    x, w, _ = data\n    out = x @ w['weight'].T + w['bias']\n"
                       "    w['weight'] = w['weight'] * 2\n    return out\n",
}


@pytest.mark.parametrize("name, status, flags", [
    ("template", "passed", []),
    ("float16_out", "passed", []),
    # Each call gets inputs of its own, rebuilt over memory the judge lent: a key added to their dict or an entry
    # rebound changes nothing the judge lent or compares; writing into the lent memory does.
    ("dict_cache", "passed", []),
    ("ignores_bias", "passed", []),
    ("writes_weight", "suspicious", []),
    ("replaces_weight", "passed", []),
])
def test_gpumode_submissions_are_judged_as_upstream_judges_them(task_folder, tmp_path, name, status, flags):
    from ksearch_graph.harness.client import SubprocessEvaluator

    task = load_task(task_folder)
    result = SubprocessEvaluator(timeout_s=120, time_budget_s=0.05).evaluate(
        task, {"submission.py": CANDIDATES[name]}, attempt_id=name)
    assert (result.status.value, result.flags) == (status, flags), result.log_excerpt
    if status == "passed":
        assert [w.workload for w in result.workloads if w.timed] == task.spec.feedback_workloads
        assert all(w.latency_us and w.latency_us > 0 for w in result.workloads if w.timed)
        assert result.environment["timing"] == "end_to_end"
    else:
        assert "wrote into its input tensors" in result.log_excerpt
    if flags:
        assert "inputs[0][1]['_cache']" in result.log_excerpt and "judged and timed as usual" in result.log_excerpt


def test_evaluate_candidate_tool_takes_a_problem_folder(tmp_path):
    candidate = tmp_path / "candidate"
    candidate.mkdir()
    (candidate / "submission.py").write_text(CANDIDATES["float16_out"])
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, str(TOOL), "--task", str(PROBLEM), "--candidate", str(candidate),
                           "--out", str(out), "--time-budget-s", "0.05"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["status"] == "passed", result["log_excerpt"]
    assert len(result["workloads"]) == 5 and math.isfinite(result["latency_us"])
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "task.yml").write_text("benchmarks: []\n")
    (broken / "reference.py").write_text("def ref_kernel(d): pass\n")
    bad = subprocess.run([sys.executable, str(TOOL), "--task", str(broken), "--candidate", str(candidate),
                          "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and "does not define generate_input" in bad.stderr


@pytest.mark.slow
def test_search_of_a_gpumode_problem_through_the_cli(tmp_path):
    """`ksearch run PROBLEM_DIR` with an LLM (scripted answers over real HTTP): the template seed is measured, the
    coder's submission (a weights cache in its input dict) is judged, timed and flagged, in the result and the
    report."""
    init = json.loads(script([insert("root", f"idea {i}", value=0.9 - 0.1 * i) for i in range(3)], reflect=False))
    update = json.loads(script([insert("n1", "continue")]))
    answer = f"Here it is.\n```python\n{CANDIDATES['dict_cache']}```\n"
    with FakeOpenAIServer([Reply.json(init), Reply.content(answer), Reply.json(update)]) as server:
        run_dir = tmp_path / "run"
        run_cli("run", str(PROBLEM), "--run-dir", str(run_dir), "--iterations", "1", "--model", "fake-model",
                "--base-url", server.base_url, check=True)
    info = json.loads(run_cli("show", str(run_dir), "--json", check=True).stdout)
    assert info["iterations_done"] == 1 and info["passed"] == 1, info
    assert (run_dir / "task" / "gpumode" / "task.py").is_file()
    assert json.loads((run_dir / "task" / "task.json").read_text())["timing"] == "end_to_end"
    run_cli("report", str(run_dir), "--out", str(tmp_path / "report"), check=True)
    assert (tmp_path / "report" / "report.md").is_file()


def test_cli_rejects_a_folder_that_is_no_problem(tmp_path):
    (tmp_path / "task.yml").write_text("benchmarks: []\n")
    proc = run_cli("run", str(tmp_path), "--run-dir", str(tmp_path / "r"))
    assert proc.returncode == 2 and "GPU MODE problem folder" in proc.stderr
    (tmp_path / "reference.py").write_text("def ref_kernel(d): pass\n")
    proc = run_cli("run", str(tmp_path), "--run-dir", str(tmp_path / "r"))
    assert proc.returncode == 2 and "does not define generate_input" in proc.stderr and not (tmp_path / "r").exists()


def _side_by_side():
    from conftest import load_module

    return load_module("gpumode_side_by_side", REPO / "tools" / "diagnostics" / "gpumode_side_by_side.py")


def test_side_by_side_writes_and_reads_upstreams_formats():
    tool = _side_by_side()
    line = tool.build_test_string([{"m": 8, "seed": 3, "nobias": False}])
    assert line == "m: 8; seed: 3; nobias: False\n"
    assert upstream_args({"m": 8, "seed": 3, "nobias": False}, "t") == {"m": 8, "seed": 3, "nobias": "False"}
    report = tool.parse_popcorn("benchmark-count: 2\nbenchmark.0.spec: m: 8; seed: 3\nbenchmark.0.mean: 1500.0\n"
                                "check: pass\n")
    assert report == {"benchmark-count": "2", "benchmark.0.spec": "m: 8; seed: 3", "benchmark.0.mean": "1500.0",
                      "check": "pass"}


@pytest.mark.slow
def test_side_by_side_runs_both_evaluators_on_our_problem(tmp_path):
    """The whole script on CPU, with this test problem's own small eval.py standing in for GPU MODE's."""
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "diagnostics" / "gpumode_side_by_side.py"),
                           "--reference-kernels", str(PROBLEM.parent.parent), "--problem", "gpumode/linear",
                           "--upstream-runs", "1", "--time-budget-s", "0.05", "--json", str(out),
                           str(PROBLEM / "submission.py")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())[str(PROBLEM / "submission.py")]
    assert report["ours"]["status"] == "passed" and report["upstream"]["tests"] == "pass"
    assert sorted(report["ours"]["latencies"]) == ["0", "1"] and sorted(report["upstream"]["runs"][0]) == ["0", "1"]
    assert "geomean" in proc.stdout and "upstream tests: pass" in proc.stdout


SLOW_LAUNCH = ("import time\n\ndef custom_kernel(data):\n    x, w, _ = data\n    t = time.perf_counter()\n"
               "    while time.perf_counter() - t < 300e-6:  # host work before the launch\n        pass\n"
               "    return x @ w['weight'].T + w['bias']\n")


@pytest.mark.gpu
@pytest.mark.parametrize("timing", ["device", "end_to_end"])
def test_end_to_end_timing_counts_the_calls_host_time(tmp_path, timing):
    """300 us of host work before a small matmul: under the launch cover (device) it is hidden, end to end it
    counts."""
    from ksearch_graph.harness.client import SubprocessEvaluator

    folder = materialise_gpumode(PROBLEM, tmp_path / "task")
    spec = json.loads((folder / "task.json").read_text())
    (folder / "task.json").write_text(json.dumps(spec | {"timing": timing}))
    task = load_task(folder)
    result = SubprocessEvaluator(timeout_s=300, time_budget_s=0.5).evaluate(
        task, {"submission.py": SLOW_LAUNCH}, attempt_id=timing)
    assert result.passed, result.log_excerpt
    latencies = [w.latency_us for w in result.workloads if w.timed]
    if timing == "end_to_end":
        assert min(latencies) >= 280, latencies
    else:
        assert max(latencies) < 150, latencies
