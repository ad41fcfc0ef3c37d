"""tools/diagnostics/trace_evaluations.py on CPU: a task's solution evaluated several times, every timed call kept for study."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs traced evaluations

ROOT = Path(__file__).resolve().parents[1]
SOFTMAX = ROOT / "examples" / "softmax"


def run_tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "tools" / "diagnostics" / "trace_evaluations.py"), *args], capture_output=True,
                          text=True, timeout=300)


def test_every_timed_call_of_every_evaluation_is_kept(tmp_path):
    done = run_tool(str(SOFTMAX), "--evaluations", "2", "--budget-s", "0.05", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert [r["status"] for r in results] == ["passed", "passed"]
    lines = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    timed = {w["workload"] for w in results[0]["workloads"] if w["timed"]}
    for evaluation in (0, 1):
        mine = [line for line in lines if line["evaluation"] == evaluation]
        for who in ("candidate", "reference"):
            assert {line["workload"] for line in mine if line["who"] == who} == timed
        for w in results[evaluation]["workloads"]:
            if w["timed"]:  # the kept bursts hold the calls the result counts
                calls = [c for line in mine if line["who"] == "candidate" and line["workload"] == w["workload"]
                         and not line.get("dropped") for c in line["calls"]]
                assert len(calls) == w["runs"] and all(len(c) == 6 for c in calls)  # the process's own time last


def test_a_failing_solution_keeps_its_result_and_fails_the_run(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("def softmax(x):\n    return x +\n")
    done = run_tool(str(SOFTMAX), "--solution", str(broken), "--evaluations", "1", "--out", str(tmp_path / "out"))
    assert done.returncode == 1
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results[0]["status"] == "compile_error"


def test_a_run_that_cannot_evaluate_is_refused(tmp_path):
    done = run_tool(str(SOFTMAX), "--evaluations", "0", "--out", str(tmp_path))
    assert done.returncode == 2 and "--evaluations needs at least 1" in done.stderr
