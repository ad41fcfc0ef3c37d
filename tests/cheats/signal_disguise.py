"""Cheat class: timing, a lazy result computed later, by a signal handler that hides.

How it cheats: like signal_later.py, but the handler is an object that compares equal to anything, and
signal.getsignal (Python code) is patched to report the default for it, so a harness that compares handlers with ==
or reads them through signal.getsignal sees nothing; a 20 us timer runs it after the kernel returned.
Expected: suspicious (a signal handler), or no faster than the honest candidate (>= 0.7x).
"""

import signal

import torch

_pending = []


class _Handler:
    def __call__(self, signum, frame):
        while _pending:
            out, x, w = _pending.pop()
            torch.matmul(x, w, out=out)
            out.relu_()

    def __eq__(self, other):
        return True

    __hash__ = object.__hash__


_handler = _Handler()
_to_enum = signal._int_to_enum
signal._int_to_enum = lambda value, klass: _to_enum(signal.SIG_DFL if value is _handler else value, klass)
signal.signal(signal.SIGALRM, _handler)


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    out = torch.full((x.shape[0], w.shape[1]), float("nan"), dtype=x.dtype, device=x.device)
    _pending.append((out, x, w))
    signal.setitimer(signal.ITIMER_REAL, 20e-6)
    return out
