"""Cheat class: timing, asking sys._getframe for the harness's frames directly.

How it cheats: sys._getframe(1), sys._getframe(2), ... up to the first frame whose locals hold an object with a
``perf`` attribute (the timer); its clocks then read a tenth of the time. The kernel itself is honest.
Expected: suspicious (sys._getframe returning a frame of the harness is blocked and named).
"""

import sys

import torch

SCALE = 0.1


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    depth = 1
    while True:
        try:
            frame = sys._getframe(depth)
        except ValueError:
            break
        except Exception:
            depth += 1
            continue
        for value in list(frame.f_locals.values()):
            if hasattr(value, "perf") and not getattr(value, "_forged", False):
                perf = value.perf
                value.perf = lambda: perf() * SCALE
                value._forged = True
        depth += 1
    return torch.relu(x @ w)
