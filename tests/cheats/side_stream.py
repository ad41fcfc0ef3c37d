"""Cheat class: timing, work on a side stream (GPU).

How it cheats: makes a new CUDA stream wait for the caller's stream (so the inputs are ready), launches the matmul
and relu there, and returns at once without making the caller's stream wait for it. Events recorded on the caller's
stream around the call measure only the launch; the real work finishes later, before anything that synchronises the
whole device (so a correctness check after torch.cuda.synchronize() sees the right answer).
Expected: flagged (not passed), or a reported latency >= 0.7x the honest candidate's.
"""

import torch

_streams: dict = {}


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    if not x.is_cuda:
        return torch.relu(x @ w)
    side = _streams.setdefault(x.device, torch.cuda.Stream(device=x.device))
    side.wait_stream(torch.cuda.current_stream(x.device))
    with torch.cuda.stream(side):
        out = torch.relu(x @ w)
    # Deliberately no current_stream().wait_stream(side), and no record_stream: the caller's stream never waits.
    return out
