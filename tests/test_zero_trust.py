"""A judge that trusts nothing from the candidate's process (issue: the candidate's process is the candidate's).

Each candidate here takes the harness's own socket at import and speaks the protocol itself (tests/cheats/takeover.py),
so no in-process guard ever runs: what stops it is only what the judge checks itself, the schema of every message
(harness/wire.py), its own copy of every output taken when the candidate says it is done (harness/lending.py), and its
own clock around each timed call, on CPU the CPU time of the candidate's whole process tree (harness/judge/time_bound.py,
cgroup.py). Every one must fail as suspicious or incorrect, and the honest candidate must pass.
"""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ksearch_graph.harness.parent.client import SubprocessEvaluator
from ksearch_graph.tasks.evaluation import Status
from ksearch_graph.tasks.task import load_task

pytestmark = pytest.mark.slow

CHEATS = Path(__file__).resolve().parent / "cheats"


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


ON_GPU = _cuda()
MODES = {  # mode -> (the statuses it may end in, what the log must name)
    "forged_times": ({Status.suspicious}, "the judge's clock"),
    "late_output": ({Status.incorrect_numerical, Status.suspicious}, ""),
    "forked_worker": ({Status.suspicious}, "the judge's clock"),
    "wildcards": ({Status.suspicious}, "the protocol does not allow"),
    "work_ahead": ({Status.incorrect_numerical}, ""),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("zero-trust") / "task"
    shutil.copytree(CHEATS / "task", folder)
    # Calls of milliseconds on CPU, so that every lie is far outside the bound's slack there (a call of a few hundred
    # microseconds hides lies inside the CPU's slack: docs/threat-model.md, "The bound, by call length").
    spec = json.loads((folder / "task.json").read_text())
    sizes = ({"m": 2048, "k": 2048, "n": 2048}, {"m": 64, "k": 8192, "n": 4096}) if ON_GPU else (
        {"m": 384, "k": 384, "n": 384}, {"m": 32, "k": 2048, "n": 1024})
    spec["workloads"] = [{"name": "square", "params": sizes[0]}, {"name": "skinny", "params": sizes[1]}]
    (folder / "task.json").write_text(json.dumps(spec))
    task = load_task(folder)
    ev = SubprocessEvaluator(timeout_s=180, time_budget_s=0.2)
    text = (CHEATS / "takeover.py").read_text()

    def run(mode: str):
        source = text if mode == "honest" else text.replace('MODE = "forged_times"', f'MODE = "{mode}"')
        files = {"kernel.py": (CHEATS / "honest.py").read_text() if mode == "honest" else source}
        return ev.evaluate(task, files, attempt_id=f"takeover-{mode}")

    names = ["honest", "minority_lie", *(m for m in MODES if not (ON_GPU and m == "forked_worker"))]
    with ThreadPoolExecutor(max_workers=1 if ON_GPU else 2) as pool:
        return dict(zip(names, pool.map(run, names)))


def test_the_honest_candidate_passes(results):
    assert results["honest"].status == Status.passed, results["honest"].log_excerpt


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_protocol_takeover_fails(results, mode):
    if mode not in results:
        pytest.skip("a forked child cannot use the parent's CUDA context")
    r = results[mode]
    statuses, named = MODES[mode]
    assert r.status in statuses and r.score == 0, f"{r.status.value}: {r.log_excerpt}"
    assert named in r.log_excerpt, r.log_excerpt


def test_lying_on_a_minority_of_calls_gains_at_most_the_slack(results):
    """Every third call reported as 1 us keeps each burst's median honest; each kept call is counted at no less than
    what the judge's clock leaves for it (time_bound.least_credible_us), so the lie buys little."""
    r, honest = results["minority_lie"], results["honest"]
    assert r.status in (Status.passed, Status.suspicious), f"{r.status.value}: {r.log_excerpt}"
    if r.status == Status.passed:
        assert "counted at what it leaves" in r.log_excerpt, r.log_excerpt
        mine = {w.workload: w.latency_us for w in honest.workloads if w.latency_us}
        for w in r.workloads:
            if w.latency_us:
                assert w.latency_us >= mine[w.workload] / 1.5, (w.workload, w.latency_us, mine[w.workload])


def test_the_bound_table_measures_what_a_passing_lie_gains(tmp_path):
    """tools/bound_table.py with a forger lying on every third call: it passes, and gains little."""
    import subprocess
    import sys

    root = CHEATS.parent.parent
    done = subprocess.run([sys.executable, str(root / "tools" / "bound_table.py"), "--lengths-us", "5000", "--factors",
                           "20", "--every", "3", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600,
                          cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    [row] = json.loads((tmp_path / "bound_table.json").read_text())["rows"]
    assert row["honest_us"] and row["largest_passing"] == 20.0, row
    assert row["largest_gain"] < 1.5, row
