"""How evaluations share one device (harness/judge/gpu_share.py), with the real file locks: timing alone, checks side
by side, a waiting timer not starved by a stream of checks, and a killed holder's hold dropped by the kernel."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from conftest import REPO

from ksearch_graph.harness.judge.gpu_share import CHECKING, STARTING, TIMING, DeviceShare


def _hold(share: DeviceShare, what: str, seconds: float, started: threading.Event | None = None) -> threading.Thread:
    def body():
        with share.hold(what):
            if started is not None:
                started.set()
            time.sleep(seconds)

    t = threading.Thread(target=body)
    t.start()
    return t


def _overlap(a, b) -> bool:
    return a[1] < b[2] and b[1] < a[2]


def test_timing_is_alone_and_checks_run_side_by_side(tmp_path):
    shares = [DeviceShare(str(tmp_path), "cpu") for _ in range(4)]
    first = threading.Event()
    threads = [_hold(shares[0], CHECKING, 0.4, first)]
    first.wait()
    threads.append(_hold(shares[1], STARTING, 0.4))  # shared: runs beside the first check
    time.sleep(0.1)
    threads.append(_hold(shares[2], TIMING, 0.3))  # waits for both, alone
    for t in threads:
        t.join()
    check, start, timing = shares[0].spans[0], shares[1].spans[0], shares[2].spans[0]
    assert _overlap(check, start), "two shared holds did not run together"
    assert not _overlap(timing, check) and not _overlap(timing, start), "a timing ran beside another hold"
    assert shares[2].waited_s > 0.15 and shares[0].waited_s < 0.05


def test_a_waiting_timer_is_not_starved_by_later_checks(tmp_path):
    check, timer, late = (DeviceShare(str(tmp_path), "cpu") for _ in range(3))
    first = threading.Event()
    threads = [_hold(check, CHECKING, 0.4, first)]
    first.wait()
    threads.append(_hold(timer, TIMING, 0.3))
    time.sleep(0.1)  # the timer waits for the check in progress
    threads.append(_hold(late, CHECKING, 0.05))  # comes after the timer: must not overtake it
    for t in threads:
        t.join()
    assert timer.spans[0][1] >= check.spans[0][2] - 0.01
    assert late.spans[0][1] >= timer.spans[0][2] - 0.01, "a later check started while a timer waited"


def test_a_killed_holder_releases_the_device(tmp_path):
    # A process holding the device for timing is killed: the kernel drops its locks, the next timer goes on.
    code = (f"import sys, time; sys.path.insert(0, {str(REPO)!r})\n"
            "from ksearch_graph.harness.judge.gpu_share import DeviceShare, TIMING\n"
            f"with DeviceShare({str(tmp_path)!r}, 'cpu').hold(TIMING):\n"
            "    print('held', flush=True); time.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        waiter = DeviceShare(str(tmp_path), "cpu")
        done = threading.Event()
        t = threading.Thread(target=lambda: (waiter.hold(TIMING).__enter__(), done.set()), daemon=True)
        t.start()
        assert not done.wait(0.3), "the timer did not wait for the holder"
        holder.kill()
        assert done.wait(10), "the killed holder's hold was not dropped"
    finally:
        holder.kill()
        holder.wait()
