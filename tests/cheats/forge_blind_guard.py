"""Cheat class: timing, an informed attacker that blinds the in-process guards before forging the clock (invented).

How it cheats: it has read the harness's source. Walking up from its own frame (no audit event) it finds the
integrity check's snapshot (held by the runner's ``guards``, a forgery.Guards) and writes its forged clock into the
snapshot itself, so the check compares the forgery with the forgery; then it makes the timer's clocks (wall, CPU
and CUDA events) read a thousandth of the time (from the moment it forged them, so no reading goes
backwards). Its call is honest but slow (80 ms of busy work on top of the matmul), so the lie is gross:
~80 us reported for ~80 ms.
Expected: suspicious, by the judge's own clock (harness/judge/time_bound.py): the process that reports the times cannot
shorten the judge's interval around each call.
"""

import sys
import time

import torch

SCALE = 0.001
WAIT_S = 0.08
_done = []


def _blind_and_forge(frame):
    timer = snapshot = None
    while frame is not None:
        for local in list(frame.f_locals.values()):
            for value in (local, getattr(local, "timer", None), getattr(local, "guards", None)):
                if hasattr(value, "perf") and hasattr(value, "heat"):
                    timer = value
                # forgery.Guards: its integrity check's guard holds the snapshot (``kept``: label, live namespace,
                # before)
                kept = getattr(getattr(getattr(value, "integrity", None), "integrity", None), "kept", None)
                if isinstance(kept, list):
                    snapshot = kept
        frame = frame.f_back
    if timer is None or snapshot is None:
        return
    anchor = timer.perf()
    fakes = {"perf": (lambda real: lambda: anchor + (real() - anchor) * SCALE)(timer.perf)}
    if getattr(timer, "cpu_clock", None) is not None:  # what times a call on CPU
        cpu_anchor = timer.cpu_clock()
        fakes["cpu_clock"] = (lambda real: lambda: cpu_anchor + (real() - cpu_anchor) * SCALE)(timer.cpu_clock)
    if getattr(timer, "elapsed", None) is not None:
        fakes["elapsed"] = (lambda real: lambda a, b: real(a, b) * SCALE)(timer.elapsed)
    namespace = vars(timer)
    for _label, live, before, _mutable in snapshot:
        if live is namespace:
            for name, fake in fakes.items():
                before[name] = (fake, None)
    namespace.update(fakes)
    _done.append(timer)


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    if not _done:
        _blind_and_forge(sys._getframe(0))
    end = time.perf_counter() + WAIT_S
    while time.perf_counter() < end:  # slow, honest work: CPU time on CPU, wall time on a GPU host
        pass
    return torch.relu(x @ w)
