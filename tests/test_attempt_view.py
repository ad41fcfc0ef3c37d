"""The speed-of-light fraction and the recorded prompts, where the user meets them: `ksearch show`, `show --attempt`,
`report` and `export`, on a GQA search with a stand-in LLM and synthetic H100 timings (tools/prompt_cache_share.py);
and an older run directory, without them, still read by every command."""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
import sys

import pytest
from conftest import REPO, run_cli

sys.path.insert(0, str(REPO / "tools"))
from prompt_cache_share import run_synthetic  # noqa: E402

GQA = REPO / "examples" / "gqa_paged_decode_h32_kv4_d128_ps1"
pytestmark = pytest.mark.slow  # one search, then the CLI in subprocesses


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("sol") / "run"
    # c1.2 passes at 0.8x its floor: faster than the hardware allows.
    _, ctx = run_synthetic(GQA, path, iterations=10, implausible="c1.2")
    ctx.store.close()
    return path


def test_show_gives_the_best_attempts_fraction_of_the_floor(run_dir):
    info = json.loads(run_cli("show", str(run_dir), "--json", check=True).stdout)
    sol = info["best"]["speed_of_light"]
    assert sol["gpu"] == "H100 SXM" and 0 < sol["fraction"] <= 1.25
    text = run_cli("show", str(run_dir), check=True).stdout
    assert "of the speed-of-light floor on H100 SXM" in text and "prompt tokens from the provider's cache" in text


def test_show_attempt_prints_the_floor_table_the_prompt_and_the_raw_answer(run_dir):
    text = run_cli("show", str(run_dir), "--attempt", "c1.2", check=True).stdout
    assert "attempt c1.2: cycle c1" in text and "% of floor" in text
    assert "IMPLAUSIBLE: faster than the floor" in text  # 0.8x the floor: 125%
    assert "----- system\nYou are an expert GPU kernel engineer" in text and "# GPU and speed of light" in text
    assert "----- answer (raw)\nHere is the kernel." in text
    info = json.loads(run_cli("show", str(run_dir), "--attempt", "c1.2", "--json", check=True).stdout)
    assert info["speed_of_light"]["implausible"] and info["exchanges"][0]["key"] == "c1.2:code"
    planner = run_cli("show", str(run_dir), "--attempt", "update:c1", check=True).stdout
    assert "update:c1:0 (planner)" in planner and '"reflection"' in planner
    missing = run_cli("show", str(run_dir), "--attempt", "c99.1")
    assert missing.returncode == 2 and "no attempt or planner call" in missing.stderr


def test_report_and_export_carry_the_fraction_and_the_prompts(run_dir, tmp_path):
    run_cli("report", str(run_dir), "--out", str(tmp_path / "report"), check=True)
    html = (tmp_path / "report" / "report.html").read_text()
    assert "of floor" in html and "speed of light" in html and "faster than the floor on" in html
    assert "of them cached" in html
    run_cli("export", str(run_dir), "--out", str(tmp_path / "out"), "--top", "2", check=True)
    best = json.loads(run_cli("show", str(run_dir), "--json", check=True).stdout)["best"]["attempt_id"]
    result = json.loads((tmp_path / "out" / best / "result.json").read_text())
    assert result["speed_of_light"]["gpu"] == "H100 SXM" and result["speed_of_light"]["per_workload"]
    prompt = json.loads((tmp_path / "out" / best / "prompt.json").read_text())
    assert prompt[0]["key"] == f"{best}:code" and prompt[0]["transcript"][0]["answer"]
    with gzip.open(tmp_path / "out" / "llm_exchanges.jsonl.gz", "rt") as f:
        keys = [json.loads(line)["key"] for line in f]
    assert "init:0" in keys and f"{best}:code" in keys


def test_an_older_run_directory_still_works(run_dir, tmp_path):
    """A run from before this change: no exchanges table, no cached-token column, no recorded work; read-only too
    (as root, which writes anyway, the store is migrated on open instead)."""
    old = tmp_path / "old"
    shutil.copytree(run_dir, old)
    with sqlite3.connect(old / "store.sqlite") as db:
        db.execute("drop table exchanges")
        db.execute("alter table llm_calls drop column cached_prompt_tokens")
        db.execute("delete from meta where key = 'workload_work'")
    for path in old.rglob("*"):
        path.chmod(0o444 if path.is_file() else 0o555)
    old.chmod(0o555)
    try:
        info = json.loads(run_cli("show", str(old), "--json", check=True).stdout)
        assert info["best"]["speed_of_light"]["gpu"] == "H100 SXM"  # the work, computed again from task/
        text = run_cli("show", str(old), "--attempt", "c1.2", check=True).stdout
        assert "no prompt was recorded" in text and "% of floor" in text
        run_cli("report", str(old), "--out", str(tmp_path / "report"), check=True)
        run_cli("export", str(old), "--out", str(tmp_path / "out"), check=True)
        assert not (tmp_path / "out" / "llm_exchanges.jsonl.gz").exists()
    finally:
        for path in [old, *old.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
