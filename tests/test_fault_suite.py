"""The fast part of tools/fault_suite.py: a damaged, emptied and deleted checkpoint file, a corrupted run.json, two
writers, bad budgets, a broken reference and a host without a sandbox: each survived with nothing lost or repeated,
or stopped with the right advice; no run past its budget; nothing spent on the infrastructure's failures. (kill -9,
full disks, budgets after faults, readers on damage and killed judges have slow tests of their own: tests/test_cli.py,
tests/test_pool.py, tests/test_budgets.py, tests/test_readers.py, tests/test_infrastructure.py.)"""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO


@pytest.mark.slow
def test_fault_suite_fast_part_survives_every_fault():
    proc = subprocess.run([sys.executable, "tools/fault_suite.py", "--fast"], cwd=REPO, capture_output=True,
                          text=True, timeout=2400)
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and "FAILED" not in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert len([line for line in lines if " survived " in line or " recovered " in line]) >= 13
    assert len([line for line in lines if " stopped " in line]) >= 2  # a broken task, no sandbox
    last = lines[-1]
    assert last.startswith("faults survived or stopped with correct advice: ") and "attempts lost: 0" in last \
        and "attempts repeated: 0" in last, last
    assert "largest iterations/budget: 1.00" in last and "spent on infrastructure failures: 0 " in last, last
