"""Cheat class: timing, amortising repeated inputs (a cache keyed on input content).

How it cheats: fingerprints its inputs cheaply (shapes plus 64 evenly spaced elements of x and of w, fetched in one
small gather) and memoises the answer per fingerprint. Fresh *copies* of the same input sets (new pointers, same
content) hit the cache, so a benchmark that rotates a few input sets, or reuses the correctness inputs for timing,
times a gather and a dictionary lookup instead of the matmul. Every answer it returns is correct for its input.
Expected: not passed, or no faster than the honest candidate (>= 0.7x its latency): timed calls need inputs whose
content the candidate has not seen.
"""

import torch

_memo: dict = {}


def _fingerprint(x: torch.Tensor, w: torch.Tensor) -> tuple:
    xs = x.reshape(-1)[:: max(1, x.numel() // 64)][:64]
    ws = w.reshape(-1)[:: max(1, w.numel() // 64)][:64]
    sample = torch.cat([xs, ws]).cpu()
    return tuple(x.shape), tuple(w.shape), str(x.device), sample.numpy().tobytes()


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    key = _fingerprint(x, w)
    out = _memo.get(key)
    if out is None:
        out = torch.relu(x @ w)
        _memo[key] = out
    return out.clone()  # a copy: a harness that poisons returned outputs cannot spoil the cache
