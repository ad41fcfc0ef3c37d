"""KernelBench problems as tasks: a tiny Linear + ReLU problem (tests/data/kernelbench/1_Linear_ReLU.py) becomes a
``module`` task whose reference builds Model from the seeded state, and whose seed ModelNew passes the harness; a
problem importing a module the host may lack says so (requires), one that downloads a model (level 4) is refused unless
the model is in the local Hugging Face cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import REPO, load_module, run_cli

from ksearch_graph.tasks.kernelbench import SEED_FILE, materialise_problem, rename_model
from ksearch_graph.tasks.task import TaskError, load_task

PROBLEM = REPO / "tests" / "data" / "kernelbench" / "1_Linear_ReLU.py"




@pytest.fixture(scope="module")
def task_folder(tmp_path_factory) -> Path:
    return materialise_problem(PROBLEM, tmp_path_factory.mktemp("kb") / "task")


def test_materialised_task_loads(task_folder):
    task = load_task(task_folder)
    s = task.spec
    assert task.name == "1_Linear_ReLU" and task.spec.description == "A linear layer followed by a ReLU."
    assert (s.entry_kind, s.entry_point, s.solution_file) == ("module", "ModelNew", "model_new.py")
    assert s.language == "pytorch"
    assert s.allowed_languages == ["pytorch", "triton"] and s.seed_solution == SEED_FILE
    assert [(w.name, w.params) for w in s.workloads] == [("default", {})]
    assert (s.tolerance.atol, s.tolerance.rtol) == (1e-4, 1e-4)  # KernelBench's fp32 tolerance since Nov 2025
    assert s.requires.model_dump(exclude_none=True) == {}
    assert "strict=True" in task.spec_text and "class Model(nn.Module)" in task.spec_text
    assert PROBLEM.read_text().rstrip() in task.reference_source  # verbatim
    seed = task.seed_source
    assert "class ModelNew(nn.Module)" in seed and "super(ModelNew, self).__init__()" in seed
    assert "get_inputs" not in seed and "get_init_inputs" not in seed and "Model(" not in seed.replace("ModelNew(", "")
    compile(seed, SEED_FILE, "exec")


def test_make_inputs_is_deterministic_and_reference_matches(task_folder):
    ref = load_module("kb_reference", task_folder / "reference.py")
    init, state, x = ref.make_inputs({}, 11, "cpu")
    init2, state2, x2 = ref.make_inputs({}, 11, "cpu")
    _, state3, x3 = ref.make_inputs({}, 12, "cpu")
    assert init == init2 == [32, 16] and x.shape == (8, 32)
    assert set(state) == {"linear.weight", "linear.bias"}
    assert all(torch.equal(state[k], state2[k]) for k in state) and torch.equal(x, x2)
    assert not torch.equal(state["linear.weight"], state3["linear.weight"]) and not torch.equal(x, x3)

    assert ref.reference is ref.Model
    model = ref.reference(*init)  # what the harness does: build, load strictly, call
    model.load_state_dict(state, strict=True)
    want = torch.relu(x @ state["linear.weight"].T + state["linear.bias"])
    assert torch.allclose(model(x), want, atol=1e-6)

    seed = load_module("kb_seed", task_folder / SEED_FILE)
    candidate = seed.ModelNew(*init)
    candidate.load_state_dict(state, strict=True)
    assert torch.equal(candidate(x), model(x))


@pytest.mark.slow
def test_seed_model_new_passes_the_harness(task_folder):
    from ksearch_graph.harness.parent.client import SubprocessEvaluator

    task = load_task(task_folder)
    result = SubprocessEvaluator(timeout_s=120, time_budget_s=0.1).evaluate(
        task, {task.spec.solution_file: task.seed_source}, attempt_id="seed")
    assert result.passed, result.log_excerpt
    assert [w.workload for w in result.workloads] == ["default"] and result.workloads[0].correct
    # A ModelNew whose parameters are named differently cannot take Model's weights.
    renamed = task.seed_source.replace("self.linear", "self.fc")
    result = SubprocessEvaluator(timeout_s=120, time_budget_s=0.1).evaluate(
        task, {task.spec.solution_file: renamed}, attempt_id="renamed")
    assert not result.passed and "fc.weight" in result.log_excerpt + str(result.workloads)


def test_rename_touches_only_the_name():
    source = ('class Model(nn.Module):\n    """Model doc: a Model."""\n    cfg = ModelConfig()\n'
              '    def __init__(self):\n        super(Model, self).__init__()  # Model\n\nm = Model()\n')
    renamed = rename_model(source)
    assert renamed == source.replace("class Model(", "class ModelNew(").replace("super(Model,", "super(ModelNew,") \
        .replace("m = Model()", "m = ModelNew()")


@pytest.mark.parametrize("text, message", [
    ("import torch\nclass Model:\n    pass\n\ndef get_inputs():\n    return []\n", "does not define get_init_inputs"),
    ("def get_inputs(): return []\ndef get_init_inputs(): return []\nModel = 3\n", "does not define Model"),
    ("class Model(:\n", r"not valid Python: .* \(line 1\)"),
])
def test_malformed_problem_says_what_is_missing(tmp_path, text, message):
    path = tmp_path / "problem.py"
    path.write_text(text)
    with pytest.raises(TaskError, match=message) as e:
        materialise_problem(path, tmp_path / "task")
    assert str(path) in str(e.value)


@pytest.mark.slow
def test_cli_resolves_a_problem_file(tmp_path):
    # The offline planner needs a kernel template, which a KernelBench task has not: a clear message, no run dir.
    proc = run_cli("run", str(PROBLEM), "--run-dir", str(tmp_path / "r"))
    assert proc.returncode == 2 and "1_Linear_ReLU has no kernel template" in proc.stderr and "--model" in proc.stderr
    assert not (tmp_path / "r").exists()


LEVEL4 = """import torch
from transformers import AutoModelForCausalLM, AutoConfig


class Model(torch.nn.Module):
    def __init__(self, model_name, config):
        super().__init__()
        self.model = AutoModelForCausalLM.from_pretrained(model_name, config=config)

    def forward(self, x):
        return self.model(x).logits


model_name = "org/tiny-model"
config = AutoConfig.from_pretrained(model_name)


def get_inputs():
    return [torch.randint(0, 100, (2, 8))]


def get_init_inputs():
    return [model_name, config]
"""


def test_a_problem_that_downloads_a_model_is_refused_unless_it_is_cached(tmp_path, monkeypatch):
    path = tmp_path / "1_tiny-model_bs2.py"
    path.write_text(LEVEL4)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(TaskError, match=r"loads org/tiny-model from the Hugging Face Hub \(from_pretrained at import\)"
                                        r", and the evaluation runs without network; it is not in the local cache .*"
                                        r"huggingface-cli download org/tiny-model"):
        materialise_problem(path, tmp_path / "task")
    (tmp_path / "hub" / "models--org--tiny-model" / "snapshots").mkdir(parents=True)
    task = load_task(materialise_problem(path, tmp_path / "task"))
    assert task.spec.requires.python_modules == ["transformers"]
    assert "from the local Hugging Face cache" in task.spec.requires.why
    assert 'environ.setdefault("HF_HUB_OFFLINE", "1")' in task.reference_source.split("from transformers")[0]
    unreadable = tmp_path / "2_other.py"
    unreadable.write_text(LEVEL4.replace('model_name = "org/tiny-model"', 'model_name = "org/" + "x"'))
    with pytest.raises(TaskError, match="whose name cannot be read without running it"):
        materialise_problem(unreadable, tmp_path / "t2")


def test_a_problem_importing_a_missing_module_is_unavailable(tmp_path):
    from ksearch_graph.harness.requirements import unmet_requirement
    from ksearch_graph.harness.tasks import read_task

    path = tmp_path / "48_Mamba.py"
    path.write_text(PROBLEM.read_text().replace("import torch\n", "import torch\nfrom no_such_einops import rearrange\n",
                                                1))
    folder = materialise_problem(path, tmp_path / "task")
    why = unmet_requirement(read_task(str(folder), None), "cpu")
    assert why == ("this task needs the Python module no_such_einops, which is not installed here (the problem "
                   "imports no_such_einops (pip install 'ksearch-graph[kernelbench]'))")
