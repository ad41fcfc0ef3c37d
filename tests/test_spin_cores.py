"""While the judge and the candidate's process both poll, they keep to separate cores (spin_cores.py)."""

import dataclasses

from ksearch_graph.harness import spin_cores
from ksearch_graph.harness.policy import POLICY


def test_polling_processes_get_separate_cores(monkeypatch):
    monkeypatch.setattr(spin_cores.os, "sched_getaffinity", lambda pid: set(range(32)))
    monkeypatch.setattr(spin_cores, "POLICY", dataclasses.replace(POLICY, spin_wait_s=0.05))
    monkeypatch.setattr(spin_cores, "host_gpus", lambda: 8)
    judges = set()
    for gpu in range(8):  # an eight-GPU node: each GPU's judge on a core of its own, none a candidate's
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", str(gpu))
        judge, candidate = spin_cores.split_cores()
        judges.add(judge)
        assert candidate == list(range(8, 32))
    assert judges == set(range(8))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5c1f0a2e")  # a UUID, as some schedulers name it
    assert spin_cores.split_cores()[0] in judges
    monkeypatch.setattr(spin_cores, "host_gpus", lambda: 1)  # one GPU: one judge core, the rest the candidates'
    assert spin_cores.split_cores() == (0, list(range(1, 32)))
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


def test_a_timing_judge_keeps_to_its_core_only_while_it_times(tmp_path):
    from ksearch_graph.harness.judge.gpu_share import TIMING, DeviceShare

    before = spin_cores.os.sched_getaffinity(0)
    share = DeviceShare(str(tmp_path), "cpu")
    share.polling_core = min(before)
    with share.hold(TIMING):
        assert spin_cores.os.sched_getaffinity(0) == {min(before)}
    assert spin_cores.os.sched_getaffinity(0) == before
