"""Cheat class: timing, a thread that finds the timer through sys._current_frames.

How it cheats: at import it starts a thread that reads every thread's current frame (sys._current_frames), walks
up the main thread's frames and makes the timer's clock (a local with a ``perf`` attribute) read a tenth of the time.
The kernel itself is honest.
Expected: suspicious (sys._current_frames is blocked and named).
"""

import sys
import threading
import time

import torch

SCALE = 0.1


def _watch():
    for _ in range(2000):
        try:
            frames = sys._current_frames()
        except Exception:
            time.sleep(0.001)
            continue
        for frame in frames.values():
            while frame is not None:
                timer = frame.f_locals.get("self")
                if hasattr(timer, "perf") and not getattr(timer, "_forged", False):
                    perf = timer.perf
                    timer.perf = lambda: perf() * SCALE
                    timer._forged = True
                frame = frame.f_back
        time.sleep(0.001)


threading.Thread(target=_watch, daemon=True).start()


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ w)
