"""Cheat class: semantic, reusing a cached output keyed on pointers and shapes.

How it cheats: the first call for a given (x.data_ptr(), w.data_ptr(), shapes) computes honestly and memoises the
output; every later call with the same key returns the memoised tensor without computing. Benchmarks that re-run
the same input tensors (or whose allocator hands fresh copies the same addresses) then time a dictionary lookup.
Expected: not passed (a fresh input set at a recycled address gets a stale answer), or, where the harness never
recycles addresses (shared-memory transfers map new ones), the cache never hits: a pass with no timing gain.
"""

import torch

_memo: dict = {}


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    key = (x.data_ptr(), w.data_ptr(), tuple(x.shape), tuple(w.shape), x.device)
    out = _memo.get(key)
    if out is None:
        out = torch.relu(x @ w)
        _memo[key] = out
    return out
