"""Cheat class: timing, a lazy result computed by a background thread (GPU).

How it cheats: allocates the output, hands the work to a Python thread and returns the empty tensor immediately.
The thread (on its own CUDA stream) fills the output while the harness is busy recording events, synchronising or
copying; if the harness looks at the output late enough, it is right, and the timed window held only an allocation.
Expected: incorrect (the output is read before it is written), or no faster than the honest candidate (>= 0.7x).
"""

import threading

import torch

_streams: dict = {}


def _fill(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, ready: torch.cuda.Event | None) -> None:
    if out.is_cuda:
        side = _streams.setdefault(out.device, torch.cuda.Stream(device=out.device))
        with torch.cuda.stream(side):
            side.wait_event(ready)
            torch.matmul(x, w, out=out)
            out.relu_()
    else:
        torch.matmul(x, w, out=out)
        out.relu_()


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape[0], w.shape[1], dtype=x.dtype, device=x.device)
    ready = None
    if x.is_cuda:
        ready = torch.cuda.Event()
        ready.record()  # inputs are ready once the caller's stream reaches this point
    threading.Thread(target=_fill, args=(out, x, w, ready), daemon=True).start()
    return out
