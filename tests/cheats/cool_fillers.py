"""Cheat class: timing, telling untimed calls from timed ones to keep a power-limited GPU cool.

How it cheats: the harness keeps the GPU under sustained load around timed calls with untimed calls of the candidate
on one repeated input set (a heat before each burst, fillers between timed calls). This candidate recognises the
repeated tensors (same objects as its last call) and returns its last output for them at once, computing only on
fresh inputs. Every timed answer is right, but the GPU idles between timed calls: a kernel that would run at the
power limit under load is timed at full clocks.
Expected on a GPU: suspicious (the untimed calls take far less time than the timed ones). On CPU there are no
untimed calls: an honest candidate.
"""

import torch

_last: list = []


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    if _last and _last[0] is x and _last[1] is w:
        return _last[2]
    out = torch.relu(x @ w)
    _last[:] = [x, w, out]
    return out
