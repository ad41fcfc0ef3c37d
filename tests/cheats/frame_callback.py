"""Cheat class: timing, a lazy result computed later, by dynamo's frame evaluation callback.

How it cheats: sets torch's frame evaluation callback (what torch.compile uses), which runs at the start of the next
Python frame after the kernel returns, inside the harness, and finishes the output there.
Expected: suspicious (a frame evaluation callback), or no faster than the honest candidate (>= 0.7x).
"""

import torch
from torch._C._dynamo.eval_frame import set_eval_frame
from torch._dynamo.types import ConvertFrameReturn, FrameAction, FrameExecStrategy

_pending = []
_RUN = FrameExecStrategy(FrameAction.DEFAULT, FrameAction.DEFAULT)


def _callback(frame, cache_entry, frame_state):
    set_eval_frame(None)
    while _pending:
        out, x, w = _pending.pop()
        torch.matmul(x, w, out=out)
        out.relu_()
    return ConvertFrameReturn(frame_exec_strategy=_RUN, apply_to_code=False)


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    out = torch.full((x.shape[0], w.shape[1]), float("nan"), dtype=x.dtype, device=x.device)
    _pending.append((out, x, w))
    set_eval_frame(_callback)
    return out
