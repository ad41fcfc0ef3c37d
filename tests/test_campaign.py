"""`ksearch campaign`: two searches side by side on one pool, each its own resumable run, one report."""

from __future__ import annotations

import json
import shutil
import sqlite3
from contextlib import closing

import pytest
from conftest import SOFTMAX, run_cli


@pytest.mark.slow
def test_campaign_runs_each_task_in_its_own_run_and_reports(tmp_path):
    other = tmp_path / "softmax2"
    shutil.copytree(SOFTMAX, other)
    spec = json.loads((other / "task.json").read_text())
    (other / "task.json").write_text(json.dumps({**spec, "name": "softmax_copy"}))
    runs = tmp_path / "campaign"
    done = run_cli("campaign", str(SOFTMAX), str(other), "--offline", "--iterations", "1", "--cpu-slots", "2",
                   "--quiet", "--runs-dir", str(runs), check=True)
    assert "report:" in done.stdout
    for name in ("softmax", "softmax_copy"):
        info = json.loads(run_cli("show", str(runs / name), "--json", check=True).stdout)
        assert info["status"] == "finished" and info["iterations_done"] == 1
        assert (runs / name / "report" / "report.html").is_file()
    report = (runs / "campaign.md").read_text()
    assert "| softmax |" in report and "| softmax_copy |" in report and "softmax/report/report.html" in report
    again = run_cli("campaign", "--runs-dir", str(runs), "--quiet", "--offline", check=True)  # resumes: all done
    assert "finished" in again.stdout
    bad = run_cli("campaign", "--runs-dir", str(tmp_path / "nothing"), "--offline")
    assert bad.returncode == 2 and "holds no campaign" in bad.stderr

    # One more iteration each, and softmax_copy's scores as if measured on an H100: the campaign checks every
    # search before any starts, so it stops with nothing recorded anywhere; allowed, it goes on and says so.
    from ksearch_graph.app.runs import extend
    from ksearch_graph.rundir.run_dir import RunDir

    for name in ("softmax", "softmax_copy"):
        run = RunDir.open(runs / name, writer=True)
        extend(run, 2)
        run.lock.release()
    with closing(sqlite3.connect(runs / "softmax_copy" / "store.sqlite")) as db, db:
        db.execute("update meta set value = ? where key = 'gpu_models'", [json.dumps([{"model": "H100", "from_iteration": 0}])])
    refused = run_cli("campaign", "--runs-dir", str(runs), "--quiet", "--offline", "--cpu-slots", "2")
    assert refused.returncode == 2 and "evaluated on H100" in refused.stderr, refused.stderr
    assert all(json.loads(run_cli("show", str(runs / n), "--json", check=True).stdout)["iterations_done"] == 1
               for n in ("softmax", "softmax_copy"))
    allowed = run_cli("campaign", "--runs-dir", str(runs), "--quiet", "--offline", "--cpu-slots", "2",
                      "--allow-gpu-change", check=True)
    assert "the GPU model changes from H100 to CPU slots" in allowed.stdout, allowed.stdout
    models = json.loads(run_cli("show", str(runs / "softmax_copy"), "--json", check=True).stdout)["gpu_models"]
    assert [m["model"] for m in models] == ["H100", "cpu"]
