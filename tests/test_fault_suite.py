"""The fast part of tools/fault_suite.py: kill -9 and resume, a damaged, emptied and deleted checkpoint file, a
corrupted run.json, two writers, a full disk and bad budgets, each survived with nothing lost or repeated."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO


@pytest.mark.slow
def test_fault_suite_fast_part_survives_every_fault():
    proc = subprocess.run([sys.executable, "tools/fault_suite.py", "--fast"], cwd=REPO, capture_output=True,
                          text=True, timeout=1800)
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and "FAILED" not in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert len([line for line in lines if "survived" in line or "recovered" in line]) >= 14
    assert lines[-1].startswith("faults survived: ") and "attempts lost: 0" in lines[-1] \
        and "attempts repeated: 0" in lines[-1]
