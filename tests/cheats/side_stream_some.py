"""Cheat class: timing, work on a side stream in a minority of calls (GPU).

How it cheats: as side_stream (the matmul and relu on a stream the caller's stream never waits for, so the events on
the caller's stream see only the launch), but in 2 calls of every 5, so in most bursts fewer than half of the timed
calls leave work running: a rule on a burst's median tail would never see it, and 40% of the calls would read
nearly free.
Expected: flagged, or a reported latency (the mean, which the score uses) >= 0.7x the honest candidate's.
"""

import torch

_streams: dict = {}
_calls = [0]


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    _calls[0] += 1
    if not x.is_cuda or _calls[0] % 5 >= 2:
        return torch.relu(x @ w)
    side = _streams.setdefault(x.device, torch.cuda.Stream(device=x.device))
    side.wait_stream(torch.cuda.current_stream(x.device))
    with torch.cuda.stream(side):
        out = torch.relu(x @ w)
    return out
