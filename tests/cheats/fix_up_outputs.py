"""Cheat class: semantic, answering later (a lazy fix-up of the copies a harness keeps for its checks).

How it cheats: its correctness calls and warm-up are honest; later (timed) calls return zeros at once, while a
background thread searches the garbage collector for (output copy, inputs) pairs that the harness keeps until it has
re-checked them, and writes the right answer into the copies. A harness that re-checks copies it has held for a
while, without knowing what they held when the call returned, passes it with a huge speedup.
Expected: not passed (incorrect_numerical or suspicious).
"""

import gc
import threading
import time

import torch

HONEST_CALLS = 7
_fixed: set = set()
_calls = [0]


def _scan() -> None:
    while True:
        time.sleep(0.0002)
        try:
            objects = gc.get_objects(0) + gc.get_objects(1)
        except Exception:
            continue
        for o in objects:
            if (type(o) is tuple and len(o) == 2 and type(o[0]) is torch.Tensor and type(o[1]) is tuple
                    and len(o[1]) == 2 and all(type(t) is torch.Tensor for t in o[1])):
                out, (x, w) = o
                if out.dim() == 2 and out.shape == (x.shape[0], w.shape[1]) and id(out) not in _fixed:
                    out.copy_(torch.relu(x @ w))
                    _fixed.add(id(out))
        del objects


threading.Thread(target=_scan, daemon=True).start()


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    _calls[0] += 1
    if _calls[0] <= HONEST_CALLS:
        return torch.relu(x @ w)
    return torch.zeros(x.shape[0], w.shape[1], dtype=x.dtype, device=x.device)
