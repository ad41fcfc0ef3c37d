"""Run directories a user cannot break, at the CLI: checked options, --more, branch at an attempt, recover,
no tracebacks, the console during long LLM calls. (Locks, damaged files, disk full: tests/test_fault_suite.py.)"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest
from conftest import REPO, SOFTMAX, FakeOpenAIServer, Reply, attempt_rows, insert, run_cli, script, show_json

pytestmark = pytest.mark.slow  # real searches through the CLI, killed and resumed


def _attempts(run_dir: Path) -> list[tuple]:
    return attempt_rows(run_dir, "id", "iteration", "prompt_kind", "base_attempt_id")


@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("rundirs") / "run"
    run_cli("run", str(SOFTMAX), "--run-dir", str(run_dir), "--iterations", "2", "--stagnation-window", "3",
            "--quiet", check=True)
    return run_dir


def test_cli_defaults_are_the_settings_defaults():
    from ksearch_graph.cli.main import build_parser
    from ksearch_graph.cli.search_commands import _config_from_args
    from ksearch_graph.config import SearchConfig

    args = build_parser().parse_args(["run", str(SOFTMAX)])
    assert _config_from_args(args) == SearchConfig()


def test_bad_numbers_are_usage_errors_that_write_nothing(small_run, tmp_path):
    manifest = (small_run / "run.json").read_bytes()
    for bad in (["--iterations", "-5"], ["--iterations", "0"], ["--iterations", "x"], ["--more", "0"],
                ["--iterations", "1"]):
        proc = run_cli("resume", str(small_run), *bad)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (bad, proc.stderr)
    assert "has 2 iterations done" in proc.stderr and "--more N" in proc.stderr
    assert (small_run / "run.json").read_bytes() == manifest and show_json(small_run)["iteration_budget"] == 2
    proc = run_cli("run", str(SOFTMAX), "--run-dir", str(tmp_path / "r"), "--iterations", "-1")
    assert proc.returncode == 2 and "greater than or equal to 1" in proc.stderr and not (tmp_path / "r").exists()

    copy = tmp_path / "more"
    shutil.copytree(small_run, copy)
    run_cli("resume", str(copy), "--more", "1", "--quiet", check=True)
    info = show_json(copy)
    assert info["iterations_done"] == 3 == info["iteration_budget"] and info["status"] == "finished"


def test_a_run_made_by_an_earlier_layout_of_the_package_resumes(tmp_path):
    """tests/data/run_dirs/softmax_2026_12: 3 iterations made by the code before the package moved into rooms
    (Dec 2026). Run directories outlive code moves: it reads, resumes and branches with today's code."""
    copy = tmp_path / "old"
    shutil.copytree(REPO / "tests" / "data" / "run_dirs" / "softmax_2026_12", copy)
    before = show_json(copy)
    assert before["iterations_done"] == 3 and before["status"] == "finished", before
    rows = _attempts(copy)
    run_cli("resume", str(copy), "--more", "1", "--quiet", check=True)
    after = show_json(copy)
    assert after["iterations_done"] == 4 == after["iteration_budget"] and after["status"] == "finished", after
    assert _attempts(copy)[:3] == rows and len(_attempts(copy)) == 4
    proc = run_cli("history", str(copy), check=True)
    assert "update_world_model" in proc.stdout


def test_broken_pipe_and_missing_files_give_no_traceback(small_run, tmp_path):
    for command in (f"show {small_run} --json | head -1", f"history {small_run} | head -2"):
        proc = subprocess.run(f"{sys.executable} -m ksearch_graph.cli.main {command}", shell=True, cwd=REPO,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and proc.stdout and proc.stderr == "", proc.stderr
    proc = run_cli("report", str(tmp_path / "nowhere"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_damaged_checkpoint_stops_readers_and_writers_then_recover_continues(small_run, tmp_path):
    run = tmp_path / "damaged"
    shutil.copytree(small_run, run)
    before = _attempts(run)
    (run / "checkpoints.sqlite").write_bytes(b"this is not a database" * 100)
    for command in ("resume", "show", "history"):
        proc = run_cli(command, str(run))
        assert proc.returncode == 2 and "recover" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    (run / "run.json").write_text("{broken")
    proc = run_cli("recover", str(run), check=True)
    assert "run.json restored" in proc.stdout and "2 evaluated attempts kept" in proc.stdout
    assert len(list(run.glob("damaged-*/checkpoints.sqlite"))) == 1  # kept aside, not deleted
    run_cli("resume", str(run), "--more", "1", "--quiet", check=True)
    after = _attempts(run)
    assert after[:2] == before and len(after) == 3  # nothing lost, nothing evaluated again
    assert show_json(run)["status"] == "finished"


def test_store_file_alone_holds_every_write_while_the_store_is_open(tmp_path):
    from ksearch_graph.rundir.store import RunStore

    store = RunStore(tmp_path / "store.sqlite")
    for i in range(20):
        store.log_event("attempt", attempt_id=f"c1.{i}", pad="x" * 2000)
    assert (tmp_path / "store.sqlite-wal").exists()  # still open: a crash now leaves the WAL beside it
    shutil.copy(tmp_path / "store.sqlite", tmp_path / "copy.sqlite")  # the main file alone, as if the WAL were lost
    with closing(sqlite3.connect(tmp_path / "copy.sqlite")) as db:
        assert db.execute("select count(*) from events").fetchone()[0] == 20
    store.close()


def test_a_lost_store_stops_until_start_over(small_run, tmp_path):

    run = tmp_path / "store-lost"
    shutil.copytree(small_run, run)
    (run / "store.sqlite").unlink()
    for command in (["resume", str(run)], ["recover", str(run)], ["show", str(run)]):
        proc = run_cli(*command)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert "store.sqlite is missing" in proc.stderr and "restore it from a copy" in proc.stderr, proc.stderr
    assert not (run / "store.sqlite").exists()  # a reader does not create an empty store over the loss
    proc = run_cli("recover", str(run), "--start-over", check=True)
    assert "starts again" in proc.stdout and len(list(run.glob("damaged-*/checkpoints.sqlite"))) == 1
    run_cli("resume", str(run), "--quiet", check=True)
    assert len(_attempts(run)) == 2 and show_json(run)["status"] == "finished"


def test_branch_at_an_attempt_continues_from_its_code(small_run, tmp_path):
    source = _attempts(small_run)
    assert [a[0] for a in source] == ["c1.1", "c1.2"]
    into = tmp_path / "at-c1.1"
    proc = run_cli("branch", str(small_run), "--at-attempt", "c1.1", "--into", str(into), check=True)
    assert "at attempt c1.1" in proc.stdout
    assert _attempts(into) == source[:1]  # the branch's past ends at c1.1
    assert json.loads((into / "run.json").read_text())["branched_from"]["attempt"] == "c1.1"
    run_cli("resume", str(into), "--quiet", check=True)
    nxt = _attempts(into)[1]
    assert nxt[0] == "c1.2" and nxt[2] == "improve" and nxt[3] == "c1.1"  # built on c1.1's code
    assert _attempts(small_run) == source  # the source run is only read
    for bad, words in (("c9.9", "no attempt"), ("seed", "--at")):
        proc = run_cli("branch", str(small_run), "--at-attempt", bad, "--into", str(tmp_path / bad))
        assert proc.returncode == 2 and words in proc.stderr, proc.stderr


def test_branch_at_a_sample_continues_from_that_samples_code(tmp_path):
    run = tmp_path / "samples"
    run_cli("run", str(SOFTMAX), "--run-dir", str(run), "--iterations", "4", "--samples", "2",
            "--stagnation-window", "3", "--quiet", check=True)
    source = sorted(_attempts(run))  # by id: a step's samples finish in either order
    assert [a[0] for a in source] == ["c1.1.1", "c1.1.2", "c1.2.1", "c1.2.2"]
    into = tmp_path / "at-c1.1.2"
    proc = run_cli("branch", str(run), "--at-attempt", "c1.1.2", "--into", str(into), check=True)
    assert "at attempt c1.1.2" in proc.stdout
    assert sorted(_attempts(into)) == source[:2]  # step 1 (both samples) is the branch's past; step 2 is not
    run_cli("resume", str(into), "--quiet", check=True)
    step2 = sorted(_attempts(into))[2:]
    assert [a[0] for a in step2] == ["c1.2.1", "c1.2.2"]
    assert all(a[2] == "improve" and a[3] == "c1.1.2" for a in step2), step2  # built on that sample's code
    assert sorted(_attempts(run)) == source
    for bad, words in (("c1.1", "has no attempt 'c1.1'"), ("c1", "'c1' is not an attempt id"),
                       ("c1.1.x", "'c1.1.x' is not an attempt id")):
        proc = run_cli("branch", str(run), "--at-attempt", bad, "--into", str(tmp_path / bad))
        assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert "c3.4.1 (cycle c3, step 4, sample 1 of 2)" in proc.stderr and not (tmp_path / bad).exists()


def _files(run_dir: Path) -> dict:
    return {name: (run_dir / name).read_bytes() for name in ("run.json", "store.sqlite", "checkpoints.sqlite")}


def _begun_on_h100(run: Path, copy: Path) -> Path:
    """A copy of ``run`` as if it had begun on an H100 host and been copied to this machine (CPU slots)."""
    shutil.copytree(run, copy)
    with closing(sqlite3.connect(copy / "store.sqlite")) as db, db:
        db.execute("update meta set value = ? where key = 'gpu_models'",
                   [json.dumps([{"model": "NVIDIA H100 80GB HBM3", "from_iteration": 0}])])
    return copy


def test_resume_on_another_gpu_model_stops_unless_allowed(small_run, tmp_path):
    assert show_json(small_run)["gpu_models"] == [{"model": "cpu", "from_iteration": 0}]  # recorded at the start
    run = _begun_on_h100(small_run, tmp_path / "h100")
    before = _files(run)
    proc = run_cli("resume", str(run), "--more", "1")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert (f"ksearch: {run} was evaluated on NVIDIA H100 80GB HBM3" in proc.stderr
            and "the evaluation pool here is CPU slots (no GPU)" in proc.stderr
            and "--allow-gpu-change" in proc.stderr), proc.stderr
    assert _files(run) == before  # stopped before anything was written

    branch = tmp_path / "h100-branch"  # a branch carries the record: running it is checked the same way
    run_cli("branch", str(run), "--at-attempt", "c1.1", "--into", str(branch), check=True)
    proc = run_cli("resume", str(branch))
    assert proc.returncode == 2 and "evaluated on NVIDIA H100 80GB HBM3" in proc.stderr, proc.stderr

    # Allowed, but nothing to run (the run is finished at its budget): nothing is recorded.
    proc = run_cli("resume", str(run), "--iterations", "2", "--allow-gpu-change", check=True)
    assert "the run is finished" in proc.stdout and "note:" not in proc.stdout, proc.stdout
    assert show_json(run)["gpu_models"] == [{"model": "NVIDIA H100 80GB HBM3", "from_iteration": 0}]

    proc = run_cli("resume", str(run), "--more", "1", "--quiet", "--allow-gpu-change", check=True)
    assert (f"note: {run}: the GPU model changes from NVIDIA H100 80GB HBM3 to CPU slots (no GPU) after "
            "iteration 2" in proc.stdout), proc.stdout
    info = show_json(run)
    assert info["iterations_done"] == 3 and info["gpu_models"] == [
        {"model": "NVIDIA H100 80GB HBM3", "from_iteration": 0}, {"model": "cpu", "from_iteration": 3, "allowed": True}]
    with closing(sqlite3.connect(run / "store.sqlite")) as db:
        (event,) = db.execute("select data from events where kind = 'gpu_changed'").fetchall()
    assert json.loads(event[0]) == {"previous": "NVIDIA H100 80GB HBM3", "model": "cpu", "iterations_done": 2}
    run_cli("report", str(run), check=True)
    assert ("NVIDIA H100 80GB HBM3 from iteration 0; cpu from iteration 3 (changed with --allow-gpu-change"
            in (run / "report" / "report.md").read_text())
    run_cli("resume", str(run), "--more", "1", "--quiet", check=True)  # from now on the run is on CPU slots
    assert show_json(run)["iterations_done"] == 4

    early = tmp_path / "before-the-change"  # a branch before the change has only the H100 in its past
    run_cli("branch", str(run), "--at-attempt", "c1.1", "--into", str(early), check=True)
    assert show_json(early)["gpu_models"] == [{"model": "NVIDIA H100 80GB HBM3", "from_iteration": 0}]
    proc = run_cli("resume", str(early))
    assert proc.returncode == 2 and "evaluated on NVIDIA H100 80GB HBM3" in proc.stderr, proc.stderr


def test_a_server_run_on_another_gpu_model_is_refused_unless_allowed(small_run, tmp_path):
    from ksearch_graph.rundir.gpu_record import GpuModelChanged
    from ksearch_graph.search.context import _server_contexts, context_for

    run = _begun_on_h100(small_run, tmp_path / "h100")
    context = {"task": str(SOFTMAX), "run_dir": str(run)}
    with pytest.raises(GpuModelChanged, match="evaluated on NVIDIA H100 80GB HBM3"):
        context_for(context)
    ctx = context_for({**context, "allow_gpu_change": True})  # the refusal left the directory unlocked
    try:
        assert [m["model"] for m in ctx.store.get_meta("gpu_models")] == ["NVIDIA H100 80GB HBM3", "cpu"]
    finally:
        _server_contexts.pop(str(run.resolve())).store.close()


def test_gpu_model_names_from_the_local_pool_and_ray_compare():
    from ksearch_graph.rundir.gpu_record import same_model

    assert same_model("NVIDIA H100 80GB HBM3", "H100") and same_model("cpu", "cpu")
    assert not same_model("NVIDIA H100 80GB HBM3", "NVIDIA H200") and not same_model("cpu", "NVIDIA H200")
    assert not same_model("NVIDIA H100 PCIe", "NVIDIA H100 80GB HBM3")
    assert same_model("A100-80G", "NVIDIA A100-SXM4-80GB") and same_model("A10G", "NVIDIA A10G")  # Ray's spellings
    assert not same_model("A100-80G", "NVIDIA A100-SXM4-40GB")


def test_long_llm_call_heartbeat_and_failed_attempt_headline(tmp_path):
    init = json.loads(script([insert("root", f"idea {i}") for i in range(3)], reflect=False))
    replies = [Reply.hang(3.5, then=Reply.json(init)),  # a slow planner call
               Reply.content("Here.\n```python\nimport torch\n\ndef kernel(:\n    pass\n```\n"),
               Reply.json(json.loads(script([insert("root", "another idea")])))]
    with FakeOpenAIServer(replies) as server:
        proc = run_cli("run", str(SOFTMAX), "--run-dir", str(tmp_path / "llm"), "--iterations", "1", "--model",
                       "fake-model", "--base-url", server.base_url, env={"KSEARCH_HEARTBEAT_S": "1"}, check=True)
    assert "[llm] planner: waiting for fake-model, 1 s" in proc.stdout
    assert "SyntaxError: invalid syntax (kernel.py, line 3)" in proc.stdout
