"""Cheat class: timing, monkey-patching the timer and synchronize.

How it cheats: at import time it makes every clock a benchmark might read run at a tenth of real speed
(time.perf_counter / perf_counter_ns / monotonic / monotonic_ns / time / process_time, timeit.default_timer), scales
torch.cuda.Event.elapsed_time (and torch.Event's) by 0.1, and replaces torch.cuda.synchronize with a sync of the
current stream only. The kernel itself is honest, so correctness passes; a harness that reads clocks or events from
inside the candidate's process reports a 10x speedup.
Expected: the reported latency is not much below the honest candidate's (>= 0.7x), or the candidate is flagged.
"""

import time
import timeit

import torch

SLOWDOWN = 0.1

_real = {name: getattr(time, name) for name in
         ("perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "process_time")}
_origin = {name: fn() for name, fn in _real.items()}


def _slow(name: str):
    real, origin = _real[name], _origin[name]
    if name.endswith("_ns"):
        return lambda: origin + int((real() - origin) * SLOWDOWN)
    return lambda: origin + (real() - origin) * SLOWDOWN


for _name in _real:
    setattr(time, _name, _slow(_name))
timeit.default_timer = time.perf_counter

for _cls in (getattr(torch.cuda, "Event", None), getattr(torch, "Event", None)):
    if _cls is not None and hasattr(_cls, "elapsed_time"):
        _orig = _cls.elapsed_time

        def _scaled(self, end_event, _orig=_orig):
            return _orig(self, end_event) * SLOWDOWN

        try:
            _cls.elapsed_time = _scaled
        except (TypeError, AttributeError):
            pass

if torch.cuda.is_available():
    def _stream_only_synchronize(device=None):
        torch.cuda.current_stream(device).synchronize()

    torch.cuda.synchronize = _stream_only_synchronize


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ w)
