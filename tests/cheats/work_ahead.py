"""Cheat class: timing, amortising work over inputs it can find ahead of their call.

How it cheats: on every call it searches the youngest garbage-collector generations for other input sets of its own
shapes (a harness that generates the inputs of several timed calls before timing them leaves them all reachable),
computes all of their outputs in this call (on a GPU on a side stream, left running) and returns them from a cache
when their inputs come. Every output is correct; every call but the first of a batch takes no time, so the median
call is free and the first call's extra work is hidden (a side-stream check that looks at the median sees nothing).
Expected: no timing gain (each workload's latency at least TIMING_FACTOR x the honest candidate's): the inputs of a
timed call must not exist before the previous timed call has finished.
"""

import gc

import torch

_cache: dict = {}
_side: list = []


def _key(x: torch.Tensor, w: torch.Tensor) -> tuple:
    return (x.data_ptr(), w.data_ptr())


def _others(x: torch.Tensor, w: torch.Tensor) -> list:
    found = {}
    for generation in (0, 1):
        for obj in gc.get_objects(generation):
            if (type(obj) is tuple and len(obj) == 2 and all(type(t) is torch.Tensor for t in obj)
                    and obj[0].shape == x.shape and obj[1].shape == w.shape and obj[0].device == x.device):
                found[_key(*obj)] = obj
    found.pop(_key(x, w), None)
    return list(found.values())


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    hit = _cache.pop(_key(x, w), None)
    if hit is not None:
        return hit
    _cache.clear()
    others = _others(x, w)
    if others and x.is_cuda:
        if not _side:
            _side.append(torch.cuda.Stream())
        _side[0].wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(_side[0]):
            for a, b in others:
                _cache[_key(a, b)] = torch.relu(a @ b)
    else:
        for a, b in others:
            _cache[_key(a, b)] = torch.relu(a @ b)
    return torch.relu(x @ w)
