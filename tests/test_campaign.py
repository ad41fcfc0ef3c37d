"""`ksearch campaign`: two searches side by side on one pool, each its own resumable run, one report."""

from __future__ import annotations

import json
import shutil

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
