"""Cheat class: timing, working ahead on inputs rebuilt from the harness's own state.

How it cheats: the candidate runs in the process that makes its timed inputs from seeds the judge sends. Once per
burst it walks up the call stack for that state (a list of integer seeds, an object with ``make_inputs``, the
workload's ``params``), rebuilds every input set it can and computes their outputs there and then (in the untimed
calls before a burst, if the harness has any), keyed by a few input values. The timed calls that follow return
those outputs at once. Every output is correct.
Expected: no timing gain (each workload's latency at least TIMING_FACTOR x the honest candidate's): a timed call's
seed must not reach the candidate's process before the previous timed call has finished.
"""

import sys

import torch

_ahead: dict = {}
_searched: set = set()


def _key(x: torch.Tensor) -> tuple:
    flat = x.reshape(-1)
    return tuple(x.shape), float(flat[0]), float(flat[-1]), float(flat[flat.numel() // 2])


def _rebuild() -> None:
    frame = sys._getframe(2)
    while frame is not None:
        local = frame.f_locals
        maker, params = local.get("self"), local.get("params")
        for value in list(local.values()):
            if (isinstance(value, list) and len(value) > 1 and all(type(v) is int for v in value)
                    and hasattr(maker, "make_inputs") and isinstance(params, dict) and id(value) not in _searched):
                _searched.add(id(value))
                for seed in value:
                    x, w = maker.make_inputs(params, seed, maker.device)
                    _ahead[_key(x)] = torch.relu(x @ w)
                return
        frame = frame.f_back


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    hit = _ahead.pop(_key(x), None)
    if hit is not None:
        return hit
    _rebuild()
    return torch.relu(x @ w)
