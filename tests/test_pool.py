"""The local evaluation pool and rolling cycles: real evaluations (the Triton interpreter on CPU slots), the real CLI.

- the pool runs evaluations at once on different slots, and never two on one slot;
- a search with k lanes on the pool, killed with SIGKILL while evaluations are in flight and a lane waits for a
  free action, then resumed: every attempt is recorded once, every cycle merged once, every waiting lane handed one
  cycle or ended once, the budget spent exactly; a branch from a rolling merge point starts from that merge's state.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest
from conftest import REPO, SOFTMAX, kernel_answer, run_cli

from ksearch_graph.harness.parent.client import SubprocessEvaluator
from ksearch_graph.harness.parent.pool import local_pool


def _kernel(task, **params) -> dict[str, str]:
    return {"kernel.py": re.search(r"```python\n(.*)```", kernel_answer(task, **params), re.S).group(1)}


@pytest.mark.slow
def test_pool_overlaps_evaluations_and_never_a_slot_with_itself(softmax_task):
    pool = local_pool(lambda env: SubprocessEvaluator(timeout_s=120, time_budget_s=0.05, env=env), cpu_slots=2)
    assert [s.name for s in pool.slots] == ["cpu0", "cpu1"] and pool.model == "cpu"
    results = {}

    def one(i: int) -> None:
        results[i] = pool.evaluate(softmax_task, _kernel(softmax_task, BLOCK_N=256 << (i % 2)), attempt_id=f"a{i}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.passed for r in results.values()), [r.log_excerpt for r in results.values()]
    assert {r.environment["pool_slot"] for r in results.values()} == {"cpu0", "cpu1"}
    assert all(r.environment["gpu_model"] == "cpu" for r in results.values())
    intervals = pool.intervals
    assert sorted(i.attempt_id for i in intervals) == ["a0", "a1", "a2", "a3"]
    for a in intervals:
        for b in intervals:
            if a is not b and a.slot == b.slot:
                assert a.end <= b.start or b.end <= a.start, "a slot was lent twice at once"
    assert any(a.slot != b.slot and a.start < b.end and b.start < a.end for a in intervals for b in intervals), \
        "no two evaluations ran at the same time"
    assert 0.5 < pool.utilisation(min(i.start for i in intervals), max(i.end for i in intervals)) <= 1.0
    # The slots share the host's device ("cpu") as lanes share a GPU: no evaluation's timing overlaps any hold of
    # another's (gpu_share.py); every evaluation held it to start, check, time and stop.
    spans = {i: r.device_spans for i, r in results.items()}
    assert all({"starting", "checking", "timing", "stopping"} <= {s[0] for s in ss} for ss in spans.values()), spans
    for i, ours in spans.items():
        for what, a, b in ours:
            if what == "timing":
                others = [s for j, ss in spans.items() if j != i for s in ss]
                assert not any(a < y and x < b for _, x, y in others), f"a timing overlapped another hold: {spans}"


def test_pool_options_are_checked(tmp_path):
    proc = run_cli("run", str(SOFTMAX), "--offline", "--iterations", "1", "--gpus", "0",
                   "--run-dir", str(tmp_path / "r"))
    assert proc.returncode == 2 and "no visible GPU 0" in proc.stderr, proc.stderr
    proc = run_cli("run", str(SOFTMAX), "--offline", "--iterations", "1", "--gpus", "0,x",
                   "--run-dir", str(tmp_path / "r2"))
    assert proc.returncode == 2 and "distinct GPU indices" in proc.stderr, proc.stderr


def _judges_of(pid: int) -> list[int]:
    """Evaluation judge processes that ``pid`` started."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and b"harness/judge/judge.py" in cmd:
            found.append(int(entry))
    return found


def _store_rows(run_dir, sql):
    with sqlite3.connect(str(run_dir / "store.sqlite")) as db:
        try:
            return db.execute(sql).fetchall()
        except sqlite3.OperationalError:  # the store's tables are not created yet
            return [(0,)]


def _round_commits(run_dir) -> list[dict]:
    """The rolling rounds' records (start and merges), in commit order."""
    rows = _store_rows(run_dir, "select payload from generations where key like 'round:%' or key like 'merge:%'")
    records = [json.loads(r[0]) for r in rows if r and isinstance(r[0], str)]
    return sorted(records, key=lambda r: (r["round"], r["seq"]))


@pytest.mark.slow
def test_rolling_lanes_on_the_pool_survive_kill9_and_branch_from_a_merge(tmp_path):
    # k 5 lanes and 3 starting actions (the offline planner's 3 algorithm families): 2 lanes start waiting.
    run_dir, iterations = tmp_path / "run", 8
    cmd = [sys.executable, "-m", "ksearch_graph.cli.main", "run", str(SOFTMAX), "--offline", "--iterations",
           str(iterations), "-k", "5", "--samples", "2", "--cpu-slots", "2", "--stagnation-window", "2",
           "--run-dir", str(run_dir)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("OPENAI_API_KEY", None)
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline, killed_in_flight = time.monotonic() + 300, 0
    while time.monotonic() < deadline and proc.poll() is None:
        commits = _round_commits(run_dir) if (run_dir / "store.sqlite").exists() else []
        judges = _judges_of(proc.pid)
        if len(commits) > 1 and commits[-1]["waiting"] and judges:  # merged, a lane waits, an evaluation runs
            proc.send_signal(signal.SIGKILL)
            killed_in_flight = len(judges)
            break
        time.sleep(0.1)
    proc.wait()
    assert killed_in_flight, "the search ended before it could be killed mid-evaluation:\n" + proc.stdout.read()
    before = {r[0] for r in _store_rows(run_dir, "select id from attempts")}

    resumed = run_cli("resume", str(run_dir), "--cpu-slots", "2", check=True)
    assert "iteration budget spent" in resumed.stdout

    attempts = [r[0] for r in _store_rows(run_dir, "select id from attempts where prompt_kind != 'seed'")]
    assert len(attempts) == iterations and len(set(attempts)) == iterations and before <= set(attempts) | {"seed"}
    events = [json.loads(r[0])["attempt_id"] for r in _store_rows(run_dir, "select data from events where kind = 'attempt'")]
    assert sorted(Counter(events).values()) == [1] * len(events), "an attempt was reported twice"
    cycles = {r[0] for r in _store_rows(run_dir, "select distinct cycle_id from attempts where prompt_kind != 'seed'")}
    merges = [r[0] for r in _store_rows(run_dir, "select key from generations where key like 'merge:%'")]
    assert sorted(merges) == sorted(f"merge:{c}" for c in cycles), "a cycle was not merged exactly once"
    # Every lane that waited was handed exactly one next cycle or its end, and no cycle was handed out twice.
    commits = _round_commits(run_dir)
    waited = {lane for r in commits for lane in r["waiting"]}
    handed = [lane for r in commits for lane in r.get("handoff", {})]
    assert waited and sorted(handed) == sorted(waited), (waited, handed)
    started = [h["next"]["id"] for r in commits for h in r.get("handoff", {}).values() if h["next"]]
    started += [r["next"]["id"] for r in commits if r.get("next")]
    assert started and len(started) == len(set(started)) and set(started) <= cycles
    show = json.loads(run_cli("show", str(run_dir), "--json", check=True).stdout)
    assert show["iterations_done"] == iterations and show["status"] == "finished"

    # A branch from the first rolling merge starts from the state that merge committed.
    rows = json.loads(run_cli("history", str(run_dir), "--json", check=True).stdout)
    first = next(r for r in rows if r["checkpoint"].startswith("merge:"))
    run_cli("branch", str(run_dir), "--at", first["checkpoint"], "--into", str(tmp_path / "b"), check=True)
    kept = {r[0] for r in _store_rows(tmp_path / "b", "select distinct cycle_id from attempts")}
    assert kept == {"seed", first["checkpoint"].split(":")[1]}
    branched = json.loads(run_cli("show", str(tmp_path / "b"), "--json", check=True).stdout)
    assert branched["iterations_done"] == first["iteration"]


def test_lanes_share_a_gpu_and_leave_the_pool_with_it(monkeypatch):
    from ksearch_graph.harness.parent import pool as pool_module

    monkeypatch.setattr(pool_module, "visible_gpus", lambda: [("0", "NVIDIA H100"), ("1", "NVIDIA H100")])
    pool = local_pool(lambda env: env["CUDA_VISIBLE_DEVICES"], lanes=2)
    assert [s.name for s in pool.slots] == ["gpu0.0", "gpu0.1", "gpu1.0", "gpu1.1"]
    assert [s.evaluator for s in pool.slots] == ["0", "0", "1", "1"]
    gpu0, other_lane = pool.slots[0], pool.slots[1]
    assert pool.lanes_of(gpu0) == [gpu0, other_lane]
    # Under CUDA_VISIBLE_DEVICES=5,7 our GPU 1 is the host's 7: that is what the slot's processes must be told.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    assert [s.evaluator for s in local_pool(lambda env: env["CUDA_VISIBLE_DEVICES"]).slots] == ["5", "7"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    # gpu0.0 breaks its GPU while gpu0.1 evaluates: both lanes leave; the recheck returns the idle one at once and
    # the busy one only when its evaluation ends (never lent twice).
    checks = []
    monkeypatch.setattr(pool, "check", lambda slot: checks.append(slot.name) or True)
    pool.recheck_s = 0.05
    leased = [pool._lease() for _ in range(2)]
    assert [s.name for s in leased] == ["gpu0.0", "gpu0.1"]
    pool._give_back(gpu0, pool_module.Interval(gpu0.name, "a", 0.0, 1.0), healthy=False)
    assert {s.name for s in pool._free} == {"gpu1.0", "gpu1.1"} and not other_lane.healthy
    deadline = time.monotonic() + 5
    while gpu0 not in pool._free and time.monotonic() < deadline:
        time.sleep(0.02)
    assert gpu0 in pool._free and other_lane not in pool._free and checks == ["gpu0.0"]
    pool._give_back(other_lane, pool_module.Interval(other_lane.name, "b", 0.0, 1.0), healthy=True)
    assert other_lane in pool._free


def test_lanes_per_gpu_option(tmp_path, monkeypatch):
    from ksearch_graph.config import SearchConfig
    from ksearch_graph.harness.parent import pool as pool_module
    from ksearch_graph.harness.parent.make_pool import PoolOptions, lanes_for, make_pool

    assert lanes_for(SearchConfig()) == 1 and lanes_for(SearchConfig(parallel_cycles=4, samples=2)) == 4
    proc = run_cli("run", str(SOFTMAX), "--offline", "--iterations", "1", "--lanes-per-gpu", "0",
                   "--run-dir", str(tmp_path / "r"))
    assert proc.returncode == 2 and "--lanes-per-gpu: 0: must be at least 1" in proc.stderr, proc.stderr
    # A GPU's lanes time its reference once between them: their evaluators share the kept timings.
    monkeypatch.setattr(pool_module, "visible_gpus", lambda: [("0", "NVIDIA H100"), ("1", "NVIDIA H100")])
    pool = make_pool(PoolOptions(lanes_per_gpu=3), SearchConfig(), None)
    try:
        kept = [s.evaluator._timings for s in pool.slots]
        assert kept[0] is kept[1] is kept[2] and kept[3] is kept[4] is kept[5] and kept[0] is not kept[3]
    finally:
        pool.close()
