"""The task.json fields the judge reads besides the basics, and their harness helpers: writable inputs (output
buffers), what the machine must have (requires), input sizes on the meta device, the judge's memory watch; and the
task loader's and the judge's defaults, which must agree."""

from __future__ import annotations

import json
import math
import textwrap
import time

import pytest
import torch

from ksearch_graph.harness.judge.compare import same
from ksearch_graph.harness.judge.input_sizes import InputsTooLarge, check_input_sizes, estimate, on_meta
from ksearch_graph.harness.judge.memory_watch import MemoryWatch, rss_bytes
from ksearch_graph.harness.modules import load_module
from ksearch_graph.harness.requirements import parse_requires, unmet_requirement
from ksearch_graph.harness.tasks import read_task
from ksearch_graph.harness.writable import parse_path, parse_writable, without_writable, writable_paths
from ksearch_graph.tasks.task import TaskError, TaskSpec, load_task

MINIMAL = {"name": "t", "entry_point": "f", "workloads": [{"name": "w", "params": {}}]}


def test_loader_and_judge_defaults_agree(tmp_path):
    """Every field the judge's read_task fills in has TaskSpec's default (the judge does not import task.py)."""
    (tmp_path / "task.json").write_text(json.dumps(MINIMAL))
    judge = read_task(str(tmp_path), None)
    spec = TaskSpec.model_validate(MINIMAL).model_dump(mode="json", exclude_none=False)
    spec["requires"] = {k: v for k, v in spec["requires"].items() if v is not None}
    filled = set(judge) - set(MINIMAL)
    assert filled >= {"check", "writable_inputs", "requires", "timing", "compare_dtype", "input_source"}
    assert {k: judge[k] for k in filled} == {k: spec[k] for k in filled}
    assert judge["tolerance"] == spec["tolerance"]
    assert judge["workloads"][0]["timed"] is spec["workloads"][0]["timed"]


def test_writable_input_paths():
    assert parse_path("inputs[0][2]") == (0, 2)
    assert parse_path("inputs[0]['out']") == (0, "out")
    assert parse_path('inputs[1]["x y"][3]') == (1, "x y", 3)
    for bad in ("inputs", "output", "inputs[0].out", "inputs[-1]", "inputs[0]['a'b']"):
        with pytest.raises(ValueError, match="is not an input path"):
            parse_path(bad)
    with pytest.raises(ValueError, match="names a path twice"):
        parse_writable(["inputs[0][1]", "inputs[0][1]"], "task.json")
    with pytest.raises(ValueError, match="must be a list"):
        parse_writable("inputs[0][1]", "task.json")


def test_writable_buffers_are_left_out_of_the_unchanged_check():
    a, b = torch.ones(3), torch.zeros(3)
    before = ((a, b, torch.empty(3).fill_(math.nan)), {"out": torch.zeros(2), "w": torch.ones(2)})
    after = ((a, b, a + b), {"out": torch.ones(2), "w": torch.ones(2)})
    paths = writable_paths({"writable_inputs": ["inputs[0][2]", "inputs[1]['out']"]})
    assert not same(before, after)
    assert same(without_writable(before, paths), without_writable(after, paths))
    # A write anywhere else is still seen.
    after[1]["w"][0] = 5.0
    assert not same(without_writable(before, paths), without_writable(after, paths))
    # The live structure is left as it was; a path that does not fit changes nothing.
    assert torch.equal(after[0][2], a + b)
    assert without_writable(before, [(5,), (1, "missing")]) == before


def test_task_loader_names_a_malformed_writable_input(tmp_path):
    (tmp_path / "spec.md").write_text("x")
    (tmp_path / "reference.py").write_text("x = 1\n")
    (tmp_path / "task.json").write_text(json.dumps(MINIMAL | {"writable_inputs": ["output"]}))
    with pytest.raises(TaskError, match=r"writable_inputs.*'output' is not an input path"):
        load_task(tmp_path)
    (tmp_path / "task.json").write_text(json.dumps(MINIMAL | {"writable_inputs": ["inputs[0][2]"]}))
    assert load_task(tmp_path).spec.writable_inputs == ["inputs[0][2]"]


def test_requirements_a_cpu_machine_lacks():
    assert unmet_requirement({}, "cpu") is None
    assert unmet_requirement({"requires": {"device": "cpu"}}, "cpu") is None
    assert "needs a GPU and this machine has none (inputs made on cuda)" in unmet_requirement(
        {"requires": {"device": "cuda", "why": "inputs made on cuda"}}, "cpu")
    assert "needs a GPU" in unmet_requirement({"requires": {"compute_capability": [10, 0]}}, "cpu")
    why = unmet_requirement({"requires": {"python_modules": ["json", "no_such_module_here"], "rocm": True}}, "cpu")
    assert why.startswith("this task needs the Python module no_such_module_here, which is not installed here")
    for bad, message in (({"gpu": True}, "not a requirement"), ({"device": "tpu"}, "must be \"cuda\""),
                         ({"compute_capability": [10]}, r"\[major, minor\]"), ({"rocm": "yes"}, "must be a bool"),
                         ({"python_modules": ["a.b"]}, "top-level module names")):
        with pytest.raises(ValueError, match=message):
            parse_requires(bad, "task.json")


REFERENCE = textwrap.dedent('''
    import torch

    def make_inputs(params, seed, device):
        n = params["n"]
        g = torch.Generator(device="cuda")  # as GPU MODE problems make theirs, whatever device is asked for
        x = torch.randn(n, n, device="cuda", generator=g)
        w = torch.empty(n, n).cuda()
        y = torch.zeros(n, dtype=torch.float16).to("cuda:0")
        return (x, {"w": w, "y": y}, n)

    def reference(x, d, n):
        return x @ d["w"]
''')


def test_input_sizes_on_the_meta_device_before_anything_is_allocated(tmp_path):
    (tmp_path / "reference.py").write_text(REFERENCE)
    ref = load_module("ksearch_sizes_reference", str(tmp_path / "reference.py"))
    n = 50_000  # 10 GB of float32 per matrix: only its size exists
    before = rss_bytes()
    assert estimate(ref, {"n": n}) == (2 * n * n * 4 + n * 2, n * n * 4)
    assert rss_bytes() - before < 200 << 20
    assert torch.Generator is torch._C.Generator  # put back
    task = {"workloads": [{"name": "small", "params": {"n": 8}}, {"name": "huge", "params": {"n": n}}]}
    with pytest.raises(InputsTooLarge, match=r"workload huge: one input set is 18.6 GiB and the reference's output "
                                             r"9.3 GiB .* over the judge's memory limit of 16.0 GiB"):
        check_input_sizes(ref, task, 16 << 30)
    assert check_input_sizes(ref, task, 1 << 50)["small"] == (8 * 8 * 4 * 2 + 16, 256)


def test_unknown_sizes_are_none():
    class Reads:
        @staticmethod
        def make_inputs(params, seed, device):
            n = int(torch.randint(1, 5, (1,)).item())  # reads a value: no size without data
            return (torch.ones(n),)

    assert estimate(Reads, {}) is None
    with on_meta():
        assert torch.ones(2).device.type == "meta"
    assert torch.ones(2).device.type == "cpu"


def test_kernelbench_module_inputs_on_the_meta_device(tmp_path):
    """A module task's inputs: its state dict and forward inputs (the init arguments are not tensors)."""
    from ksearch_graph.tasks.kernelbench import materialise_problem

    folder = materialise_problem(__import__("conftest").REPO / "tests" / "data" / "kernelbench" / "1_Linear_ReLU.py",
                                 tmp_path / "kb")
    ref = load_module("ksearch_sizes_kb", str(folder / "reference.py"))
    inputs, outputs = estimate(ref, {}, "module")
    model = ref.Model(*ref.get_init_inputs())
    expected = sum(t.numel() * t.element_size() for t in list(model.state_dict().values()) + ref.get_inputs())
    assert inputs == expected and outputs > 0


def test_memory_watch_calls_back_once_over_the_limit():
    seen = []
    with MemoryWatch(1, seen.append, interval_s=0.01):
        time.sleep(0.2)
    assert len(seen) == 1 and seen[0] > 1
    with MemoryWatch(1 << 50, seen.append, interval_s=0.01) as watch:
        time.sleep(0.05)
    assert len(seen) == 1 and watch.peak > 0
