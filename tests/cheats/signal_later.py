"""Cheat class: timing, a lazy result computed later, by a signal handler.

How it cheats: installs a SIGALRM handler, returns an empty output and arms a 50 us timer. Python runs the handler
between two bytecodes of whatever runs then: after the timer stopped, before the harness copies the output, the
handler finishes it, untimed.
Expected: suspicious (a signal handler), or no faster than the honest candidate (>= 0.7x).
"""

import signal

import torch

_pending = []


def _finish(signum, frame):
    while _pending:
        out, x, w = _pending.pop()
        torch.matmul(x, w, out=out)
        out.relu_()


signal.signal(signal.SIGALRM, _finish)


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape[0], w.shape[1], dtype=x.dtype, device=x.device)
    _pending.append((out, x, w))
    signal.setitimer(signal.ITIMER_REAL, 50e-6)
    return out
