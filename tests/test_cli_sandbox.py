"""The candidates' sandbox at the CLI: a host that cannot make one (KSEARCH_BWRAP names no bwrap, so none is looked
up on PATH) stops run, campaign and resume at preflight with the install hint, nothing written and nothing spent;
``--sandbox none`` runs there with a warning, kept with the run, and every result records its isolation. A sandbox
that starts no evaluation is the pool's failure, never the task's or a candidate's."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from conftest import SOFTMAX, run_cli

NO_BWRAP = {"KSEARCH_BWRAP": "/nonexistent"}
HINT = "install bubblewrap (Debian/Ubuntu: `sudo apt-get install bubblewrap`"


def _refused(proc) -> bool:
    return (proc.returncode == 69 and "candidates run in a sandbox, and this host cannot make one" in proc.stderr
            and HINT in proc.stderr and "`--sandbox none` runs candidates without it" in proc.stderr
            and "Traceback" not in proc.stderr)


def test_a_host_without_a_sandbox_stops_run_and_campaign_before_anything_is_written(tmp_path):
    proc = run_cli("run", str(SOFTMAX), "--run-dir", str(tmp_path / "run"), "--iterations", "1", env=NO_BWRAP)
    assert _refused(proc) and "Nothing was written and nothing spent" in proc.stderr, proc.stderr
    proc = run_cli("campaign", str(SOFTMAX), "--runs-dir", str(tmp_path / "campaign"), "--iterations", "1",
                   env=NO_BWRAP)
    assert _refused(proc), proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_sandbox_that_starts_no_evaluation_is_the_pools_failure_not_the_tasks(tmp_path):
    """bwrap passes the host check but refuses every real sandbox (as where user namespaces run out): the seed's
    evaluation fails before any of its code ran, three times, so preflight stops (69) blaming the pool."""
    bwrap = tmp_path / "bwrap"
    bwrap.write_text('#!/bin/sh\nfor last; do :; done\n[ "$last" = true ] && exit 0\n'
                     'echo "bwrap: setting up uid map: Permission denied" >&2\nexit 1\n')
    bwrap.chmod(0o755)
    proc = run_cli("run", str(SOFTMAX), "--run-dir", str(tmp_path / "run"), "--iterations", "1",
                   env={"KSEARCH_BWRAP": str(bwrap)})
    assert proc.returncode == 69 and "failed 3 times outside the task's code" in proc.stderr, proc.stderr
    assert "died before any candidate code ran" in proc.stderr and "fix the task" not in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()


def _isolations(run: Path) -> dict[str, str]:
    with closing(sqlite3.connect(f"file:{run / 'store.sqlite'}?immutable=1", uri=True)) as db:
        return {a: json.loads(r)["environment"].get("isolation", "")
                for a, r in db.execute("select id, result from attempts")}


@pytest.mark.slow
def test_sandbox_none_runs_warns_and_is_kept_on_resume(tmp_path):
    run = tmp_path / "run"
    proc = run_cli("run", str(SOFTMAX), "--run-dir", str(run), "--iterations", "1", "--sandbox", "none", "--quiet",
                   env=NO_BWRAP)
    assert proc.returncode == 0, proc.stderr
    assert "warning: --sandbox none: candidates' code runs without a sandbox" in proc.stderr
    assert json.loads((run / "run.json").read_text())["config"]["sandbox"] == "none"
    isolations = _isolations(run)
    assert sorted(isolations) == ["c1.1", "seed"] and all(i.startswith("none") for i in isolations.values())

    proc = run_cli("resume", str(run), "--more", "1", "--quiet", env=NO_BWRAP)  # the run keeps its setting
    assert proc.returncode == 0 and "warning: --sandbox none" in proc.stderr, proc.stderr
    assert len(_isolations(run)) == 3

    before = (run / "run.json").read_text()
    proc = run_cli("resume", str(run), "--more", "1", "--sandbox", "bwrap", env=NO_BWRAP)
    assert _refused(proc), proc.stderr
    assert (run / "run.json").read_text() == before and len(_isolations(run)) == 3
