"""Cheat class: timing, moving the start event of the call it is in past its own work (GPU only).

How it cheats: in every timed call, it launches its (honest) kernels, then walks up from its own frame through f_back
(no audit event) to the timer's frame and reads that frame's ``start`` event from its locals (reading is allowed; no
write to the harness). It records that event again on the current stream: behind the kernels it just launched. The
call's device time, start to end, is then only what runs after it returns. Nothing of the harness is changed, so the
in-process guards have nothing to find. On CPU there is no event: the candidate is honest there.
Expected (GPU): suspicious, by the judge's clock, on calls much longer than its slack (the square workload: ~0.3 ms
on an H200); a call of tens of microseconds hides inside the slack (docs/threat-model.md, layer 3).
"""

import sys

import torch


def _timer_frame():
    frame = sys._getframe(1).f_back
    while frame is not None:
        names = frame.f_locals
        if "start" in names and "elapsed" in names:
            return names
        frame = frame.f_back
    return None


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    out = torch.relu(x @ w)
    names = _timer_frame()
    if names is not None and hasattr(names["start"], "record"):
        names["start"].record()
    return out
