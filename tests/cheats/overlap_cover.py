"""Cheat class: timing, work on another stream that starts before the timed stream gets to the call (GPU).

How it cheats: the inputs are ready before a timed call is launched (the harness made them and waited for the
device), so this does not make its stream wait for the caller's: it runs the matmul and relu on a high-priority side
stream at once, then makes the caller's stream wait for them, as a well-behaved multi-stream kernel joins back.
Whatever the harness has queued on the caller's stream ahead of the start event (an L2 flush, a spin that covers the
launch) runs while the real work does: the events around the call see only the join, and nothing is left running
after the call's end event.
Expected: flagged (not passed), or a reported latency >= 0.7x the honest candidate's.
"""

import torch

_streams: dict = {}


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    if not x.is_cuda:
        return torch.relu(x @ w)
    side = _streams.setdefault(x.device, torch.cuda.Stream(device=x.device, priority=-1))  # -1: high priority
    with torch.cuda.stream(side):
        out = torch.relu(x @ w)
    caller = torch.cuda.current_stream(x.device)
    caller.wait_stream(side)
    out.record_stream(caller)
    return out
