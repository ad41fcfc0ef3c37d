"""Cheat class: timing, rewriting the timings on their way to the judge (invented: the clock is left alone).

How it cheats: finds the runner's connection (a local ``conn`` of its frames, reached through f_back) and wraps the
connection class's ``send``, so a Timed message leaves with every call's device and host time
divided by ten. The kernel itself is honest.
Expected: suspicious (the integrity check watches the connection and its class).
"""

import sys

import torch

SCALE = 0.1
_done = []


def _forge(conn):
    cls = type(conn)
    real = cls.send

    def send(self, obj):
        if type(obj).__name__ == "Timed":  # the harness's protocol.Timed: (calls, fingerprints, flags, untimed)
            obj = obj._replace(calls=[(d * SCALE, t, p, h * SCALE) for d, t, p, h in obj.calls])
        return real(self, obj)

    cls.send = send
    _done.append(conn)


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    frame = sys._getframe(0)
    while frame is not None and not _done:
        conn = frame.f_locals.get("conn")
        if conn is not None and hasattr(conn, "send"):
            _forge(conn)
        frame = frame.f_back
    return torch.relu(x @ w)
