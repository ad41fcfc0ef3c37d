"""While the judge and the candidate's process both poll, they keep to separate cores (spin_cores.py)."""

import dataclasses

from ksearch_graph.harness import spin_cores
from ksearch_graph.harness.policy import POLICY


def test_polling_processes_get_separate_cores(monkeypatch):
    monkeypatch.setattr(spin_cores.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(spin_cores, "POLICY", dataclasses.replace(POLICY, spin_wait_s=0.05))
    judge, candidate = spin_cores.split_cores()
    assert judge not in candidate and set(candidate) == {2, 3}  # half the host's cores are the judges'
    monkeypatch.setattr(spin_cores.os, "sched_getaffinity", lambda pid: set(range(32)))
    judges = set()
    for gpu in range(8):  # an eight-GPU node: each GPU's judge on a core of its own, none a candidate's
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", str(gpu))
        judge, candidate = spin_cores.split_cores()
        judges.add(judge)
        assert candidate == list(range(8, 32))
    assert judges == set(range(8))
    monkeypatch.setattr(spin_cores.os, "sched_getaffinity", lambda pid: {5})
    assert spin_cores.split_cores() is None  # one core: nothing to split
    monkeypatch.setattr(spin_cores, "POLICY", dataclasses.replace(POLICY, spin_wait_s=0.0))
    monkeypatch.setattr(spin_cores.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert spin_cores.split_cores() is None  # nobody polls: the scheduler places both


def test_pin_keeps_to_the_cores_it_is_given():
    before = spin_cores.os.sched_getaffinity(0)
    try:
        one = min(before)
        spin_cores.pin([one])
        assert spin_cores.os.sched_getaffinity(0) == {one}
        spin_cores.pin([10_000])  # not a core of this host: refused, left as it was
        assert spin_cores.os.sched_getaffinity(0) == {one}
    finally:
        spin_cores.os.sched_setaffinity(0, before)
