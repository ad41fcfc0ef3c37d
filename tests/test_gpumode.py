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

from ksearch_graph.tasks.gpumode import SEED_FILE, materialise_gpumode, upstream_args
from ksearch_graph.tasks.task import TaskError, load_task

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
        with pytest.raises(TaskError, match="the problem's eval.py rejects"):
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
        (problem("def ref_kernel(d): pass\n"), "does not define generate_input"),
        (problem(base), "defines no check_implementation"),
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
    from ksearch_graph.harness.parent.client import SubprocessEvaluator

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


def test_side_by_side_starts_no_timed_step_past_its_deadline(tmp_path):
    import time

    tool = _side_by_side()
    runs = tool.upstream_benchmarks(tmp_path, "eval.py", 3, "benchmark", 60, "x", time.monotonic() + 30)
    assert runs == ["not run: another 60 s would pass the deadline"]


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
    from ksearch_graph.harness.parent.client import SubprocessEvaluator

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


# ---- problems laid out as upstream's competitions: shared files one folder up (tests/data/gpumode/family) ----------

FAMILY = REPO / "tests" / "data" / "gpumode" / "family"


def judge_call(folder: Path, submission: str, workload: int = 0, seed: int = 0):
    """What the judge does with one call of a materialised problem, in this process: its inputs, the candidate's call
    on its own inputs, then the task's check (or the elementwise comparison) and the unchanged-inputs check with the
    writable inputs left out. Returns (status, message, the judge's inputs after the check)."""
    from ksearch_graph.harness.judge.compare import compare, same
    from ksearch_graph.harness.modules import load_module
    from ksearch_graph.harness.task_checks import run_check
    from ksearch_graph.harness.tasks import read_task
    from ksearch_graph.harness.tensors import as_tensors, clone
    from ksearch_graph.harness.writable import without_writable, writable_paths

    task = read_task(str(folder), None)
    ref = load_module("ksearch_reference", str(folder / task["reference"]))
    w = task["workloads"][workload]
    pristine = ref.make_inputs(w["params"], seed, "cpu")
    expected = as_tensors(ref.reference(*clone(pristine)))
    mine = ref.make_inputs(w["params"], seed, "cpu")  # the candidate's process makes its own
    namespace: dict = {}
    exec(submission, namespace)
    out = namespace["custom_kernel"](*mine)
    out = out.clone() if isinstance(out, torch.Tensor) else type(out).__name__
    paths = writable_paths(task)
    if not same(without_writable(pristine, paths), without_writable(mine, paths)):
        return "suspicious", "the candidate wrote into its input tensors", pristine
    if task["check"]:
        status, message = run_check(str(folder), task, pristine, out, expected)
    else:
        status, message, *_ = compare(out, expected, task["tolerance"], task["compare_dtype"])
    return status, message, pristine


import torch  # noqa: E402  (the family's tests drive tensors directly)


def test_files_are_read_as_gpu_modes_runner_reads_them(tmp_path):
    """Sources relative to task.yml's folder, shared ones one folder up; the destination name must stay inside."""
    folder = materialise_gpumode(FAMILY / "buffers", tmp_path / "task")
    assert (folder / "gpumode" / "utils.py").read_text() == (FAMILY / "utils.py").read_text()
    assert sorted(p.name for p in (folder / "gpumode").iterdir()) == ["reference.py", "task.py", "task.yml",
                                                                      "utils.py"]
    assert (folder / "seed_submission.py").read_text() == (FAMILY / "template.py").read_text()
    problem = tmp_path / "copy" / "buffers"
    problem.parent.mkdir()
    (problem.parent / "utils.py").write_text((FAMILY / "utils.py").read_text())
    problem.mkdir()
    for name in ("task.py", "reference.py"):
        (problem / name).write_text((FAMILY / "buffers" / name).read_text())
    yml = (FAMILY / "buffers" / "task.yml").read_text()
    for files, message in (('"name": "../utils.py", "source": "../utils.py"', "leaves the folder"),
                           ('"name": "/tmp/utils.py", "source": "../utils.py"', "leaves the folder"),
                           ('"name": "utils.py", "source": "../../utils.py"', r"is not a file \(a checkout")):
        (problem / "task.yml").write_text(yml.replace('"name": "utils.py", "source": "../utils.py"', files))
        with pytest.raises(TaskError, match=message):
            materialise_gpumode(problem, tmp_path / "out")


def test_output_buffers_may_be_written_and_arrive_poisoned(tmp_path):
    folder = materialise_gpumode(FAMILY / "buffers", tmp_path / "task")
    spec = load_task(folder).spec
    assert spec.writable_inputs == ["inputs[0][2]"] and spec.check is None
    assert "are output buffers" in load_task(folder).spec_text
    fills = "def custom_kernel(data):\n    a, b, out = data\n    out[...] = a + b\n    return out\n"
    status, _, pristine = judge_call(folder, fills)
    assert status is None and torch.isnan(pristine[0][2]).all()  # torch.empty upstream: NaN here, in both processes
    assert judge_call(folder, "def custom_kernel(data):\n    *_, out = data\n    return out\n")[0] \
        == "incorrect_numerical"  # the template: the buffer untouched
    writes_a = "def custom_kernel(data):\n    a, b, out = data\n    a.add_(b)\n    return a.clone()\n"
    assert judge_call(folder, writes_a)[0] == "suspicious"


def test_a_problems_own_check_judges_the_output(tmp_path):
    folder = materialise_gpumode(FAMILY / "prefix", tmp_path / "task")
    spec = load_task(folder).spec
    assert spec.check.model_dump() == {"module": "reference.py", "function": "check_implementation"}
    assert spec.writable_inputs == ["inputs[0][1]"] and "own `check_implementation" in load_task(folder).spec_text
    exact = ("import torch\ndef custom_kernel(data):\n    x, out = data\n"
             "    return torch.cumsum(x.double(), 0).float()\n")
    assert judge_call(folder, exact, workload=1)[:2] == (None, "")
    # 1e-4 off: outside 1e-5 * sqrt(10) on the small test, inside 1e-5 * sqrt(4096) on the large one
    off = exact.replace(".float()\n", ".float() * (1 + 1e-4)\n")
    status, message, _ = judge_call(folder, off, workload=0)
    assert status == "incorrect_numerical" and message.startswith("Number of mismatched elements")
    assert judge_call(folder, off, workload=1)[0] is None
    assert judge_call(folder, "def custom_kernel(data):\n    return {}\n")[0] == "incorrect_shape"


def test_list_valued_specs_are_parsed_as_the_problems_eval_py_parses_them(tmp_path):
    folder = materialise_gpumode(FAMILY / "grouped", tmp_path / "task")
    spec = load_task(folder).spec
    assert [(w.name, w.params) for w in spec.workloads] == [
        ("test-00-m4x8-k16", {"m": [4, 8], "k": 16, "seed": 6}),
        ("bench-00-m32x16x8-k32", {"m": [32, 16, 8], "k": 32, "seed": 7})]
    ok = "import torch\ndef custom_kernel(data):\n    xs, w = data\n    return torch.cat([x @ w for x in xs])\n"
    assert judge_call(folder, ok, workload=1)[0] is None  # generate_input asserts it got a tuple


def test_multi_gpu_and_other_interfaces_are_refused_with_the_reason(tmp_path):
    with pytest.raises(TaskError, match=r"a multi-GPU problem \(its specs run on 4, 8 GPUs\); ksearch evaluates a "
                                        r"candidate in one process on one GPU"):
        materialise_gpumode(FAMILY / "multi", tmp_path / "m")
    with pytest.raises(TaskError, match=r"does not define ref_kernel and generate_input \(it defines "
                                        r"reference_forward, reference_backward, generate_inputs\)"):
        materialise_gpumode(FAMILY / "other", tmp_path / "o")


def test_a_problem_that_needs_a_gpu_is_unavailable_here(tmp_path):
    from ksearch_graph.harness.requirements import unmet_requirement
    from ksearch_graph.harness.tasks import read_task

    folder = materialise_gpumode(FAMILY / "cuda_only", tmp_path / "task")
    assert load_task(folder).spec.requires.device == "cuda"
    why = unmet_requirement(read_task(str(folder), None), "cpu")
    assert why == ('this task needs a GPU and this machine has none (its generate_input makes its tensors on '
                   '"cuda")')
    assert unmet_requirement(read_task(str(materialise_gpumode(FAMILY / "buffers", tmp_path / "b")), None),
                             "cpu") is None


def test_cpu_side_distributions_are_sampled_on_the_evaluation_device(tmp_path):
    """TriMul draws its Cauchy input from torch.distributions on the CPU (seconds per call at its sizes, in both
    processes, for every timed call): the task draws it on the device the harness asks for."""
    from ksearch_graph.harness.modules import load_module

    problem = tmp_path / "cauchy"
    problem.mkdir()
    for shared in ("utils.py", "eval.py"):
        (tmp_path / shared).write_text((FAMILY / shared).read_text())
    (problem / "task.yml").write_text((FAMILY / "cuda_only" / "task.yml").read_text())
    (problem / "reference.py").write_text(
        "import torch\nfrom utils import device, make_match_reference\n\n\ndef ref_kernel(data):\n    return data * 2\n"
        "\n\ndef generate_input(size, seed):\n    x = torch.distributions.Cauchy(0, 2).sample((size,))\n"
        "    return x + torch.zeros(size, device=x.device)\n\n\n"
        "check_implementation = make_match_reference(ref_kernel)\n")
    folder = materialise_gpumode(problem, tmp_path / "task")
    assert "the same distribution, other values" in load_task(folder).spec_text
    ref = load_module("ksearch_cauchy_reference", str(folder / "reference.py"))
    assert ref._SAMPLE_ON_DEVICE is True
    torch.distributions.Distribution.set_default_validate_args(False)  # validation reads values
    try:
        (x,) = ref.make_inputs({"size": 8, "seed": 1}, 5, "meta")
    finally:
        torch.distributions.Distribution.set_default_validate_args(True)
    assert x.device.type == "meta"  # drawn where the harness asked, not on the CPU
    assert torch.equal(ref.make_inputs({"size": 8, "seed": 1}, 5, "cpu")[0],
                       ref.make_inputs({"size": 8, "seed": 1}, 5, "cpu")[0])


@pytest.mark.slow
def test_the_judge_runs_the_problems_check_honours_buffers_and_requirements(tmp_path):
    """The same cases through the real judge (two processes, the sandbox): a filled output buffer passes and a
    written input does not; the problem's own check decides (its message kept); a problem that needs a GPU is
    `unavailable` here with the reason."""
    from concurrent.futures import ThreadPoolExecutor

    from ksearch_graph.harness.parent.client import SubprocessEvaluator

    buffers = load_task(materialise_gpumode(FAMILY / "buffers", tmp_path / "buffers"))
    prefix = load_task(materialise_gpumode(FAMILY / "prefix", tmp_path / "prefix"))
    cuda_only = load_task(materialise_gpumode(FAMILY / "cuda_only", tmp_path / "cuda_only"))
    exact = ("import torch\ndef custom_kernel(data):\n    x, out = data\n"
             "    return torch.cumsum(x.double(), 0).float()\n")
    cases = {
        "fills": (buffers, "def custom_kernel(data):\n    a, b, out = data\n    out[...] = a + b\n    return out\n"),
        "writes_a": (buffers, "def custom_kernel(data):\n    a, b, out = data\n    a.add_(b)\n    return a.clone()\n"),
        "exact": (prefix, exact),
        "off": (prefix, exact.replace(".float()\n", ".float() * (1 + 1e-4)\n")),
        "gpu": (cuda_only, (FAMILY / "template.py").read_text()),
    }
    ev = SubprocessEvaluator(timeout_s=180, time_budget_s=0.05, workloads="all")  # the tests too, as upstream
    with ThreadPoolExecutor(2) as pool:
        got = dict(zip(cases, pool.map(lambda c: ev.evaluate(c[0], {"submission.py": c[1]}, attempt_id="t"),
                                       cases.values())))
    assert got["fills"].status.value == "passed", got["fills"].log_excerpt
    assert got["writes_a"].status.value == "suspicious", got["writes_a"].log_excerpt
    assert "wrote into its input tensors" in got["writes_a"].log_excerpt
    assert got["exact"].status.value == "passed", got["exact"].log_excerpt
    assert got["off"].status.value == "incorrect_numerical", got["off"].log_excerpt
    assert "Number of mismatched elements" in got["off"].log_excerpt  # the check's own words
    assert got["gpu"].status.value == "unavailable", got["gpu"].log_excerpt
    assert "this task needs a GPU and this machine has none" in got["gpu"].log_excerpt
