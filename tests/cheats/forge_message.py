"""Cheat class: timing, rewriting the timings on their way to the judge (invented: the clock is left alone).

How it cheats: finds the runner's channel to the judge (an attribute ``channel`` of a local of its frames, reached
through f_back) and wraps the channel class's ``send``, so every Done message leaves with its call's device and host
time divided by ten. The kernel itself is honest.
Expected: suspicious (the integrity check watches the channel and its class; the judge's clock bounds the lie).
"""

import sys

import torch

SCALE = 0.1
_done = []


def _forge(conn):
    cls = type(conn)
    real = cls.send

    def send(self, obj, *more):
        if type(obj).__name__ == "Done":  # the harness's wire.Done: (index, [device, tail, probe, host], output)
            d, t, p, h = obj.times
            obj = obj._replace(times=[d * SCALE, t, p, h * SCALE])
        return real(self, obj, *more)

    cls.send = send
    _done.append(conn)


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    frame = sys._getframe(0)
    while frame is not None and not _done:
        for local in list(frame.f_locals.values()):
            conn = getattr(local, "channel", None)
            if conn is not None and hasattr(conn, "send") and not _done:
                _forge(conn)
        frame = frame.f_back
    return torch.relu(x @ w)
