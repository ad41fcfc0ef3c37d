"""The GPU self-test's command line on a machine without a GPU, and its report (tools/gpu_selftest.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # runs the self-test's evaluations

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import gpu_selftest  # noqa: E402

NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer without a GPU")


def run_tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_selftest.py"), *args], capture_output=True,
                          text=True, timeout=120)


@NO_GPU
def test_without_a_gpu_it_says_so_and_fails():
    done = run_tool("--skip-tests")
    assert done.returncode == 2 and "no CUDA GPU here" in done.stdout, (done.stdout, done.stderr)


@pytest.mark.parametrize("args", [["--evaluations", "1"], ["--budget-s", "0"], ["--budget-s", "nan"]])
def test_a_calibration_that_cannot_give_a_spread_is_refused(args):
    done = run_tool(*args)
    assert done.returncode == 2 and "--evaluations needs at least 2" in done.stderr, done.stderr


def test_the_report_names_its_evaluations_budget_and_dropped_bursts():
    row = {"workload": "mm-bf16-3072", "harness_mean_us": 77.5, "repeat_spread_pct": 1.6, "speedups": [0.99, 1.01],
           "speedup_spread_pct": 2.0, "graph_us": 75.2,
           "bursts": [{"candidate": [[0, 10, 107.6, "dropped"], [10, 10, 77.3]], "reference": [[0, 10, 77.0]]},
                      {"candidate": [[0, 10, 77.7]], "reference": [[0, 10, 76.6]]}]}
    for name in gpu_selftest.COMPARED:
        row |= {name: 78.0, f"{name}_spread_pct": 1.0, f"vs_{name}_pct": -0.6}
    report = {"date": "2026-12-04", "environment": "NVIDIA H200", "evaluations": 6, "budget_s": 2.0,
              "calibration": [row, {"workload": "mm-bf16-8192"}]}
    text = gpu_selftest.markdown(report)
    assert "| workload | harness (6 evaluations, 2 s budget) |" in text
    assert "| mm-bf16-3072 | 77.5 us | 1.60% | 0.990-1.010 | 2.00% |" in text
    assert "- mm-bf16-3072: 10: 107.6 (dropped) 10: 77.3; 10: 77.0 | 10: 77.7; 10: 76.6" in text
    assert "| mm-bf16-8192 | failed |" in text


def test_the_handover_diagnostic_runs_and_the_report_shows_it_and_the_bound(tmp_path):
    out = tmp_path / "handover.json"
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "diagnostics" / "diagnose_handover.py"), "--device",
                           "cpu", "--calls", "8", "--max-mb", "2", "--json", str(out)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    rows = json.loads(out.read_text())
    assert [r["case"] for r in rows][:2] == ["2 MB fresh", "256 MB fresh, read all"] and all(r["calls"] == 3 for r in rows)
    report = {"date": "2026-12-07", "environment": "NVIDIA H100", "calibration": [],
              "handover": {"command": "tools/diagnostics/diagnose_handover.py", "rows": rows},
              "bound": {"command": "tools/bound_table.py", "rows": {"rows": [{"length_us": 1000.0, "largest_passing": 1.5, "largest_gain": 1.1},
                                                                            {"length_us": 10000.0, "largest_passing": None}]}}}
    text = gpu_selftest.markdown(report)
    assert "| 2 MB fresh |" in text and "1000 us: 1.5 (gain 1.1), 10000 us: none (gain -)" in text
