"""Crash class: network access from candidate code.

How it cheats: tries to reach the outside world: a TCP connection to PROBE_HOST:PROBE_PORT (the suite replaces these
with a listener it runs on the host, so a success is visible from outside the candidate too), to public DNS servers
(1.1.1.1:53, 8.8.8.8:53), and a DNS lookup. A candidate with network access can exfiltrate code or keys, download a
precomputed answer, or coordinate with another process. If any attempt succeeds it raises with "NETWORK REACHABLE"
and what it reached, so the leak shows in the log; otherwise it computes an honest answer.
Expected: passed, with no "NETWORK REACHABLE" in the log and no connection at the suite's listener.
"""

import socket

import torch

PROBE_HOST = "127.0.0.1"
PROBE_PORT = 9  # the suite's listener
TARGETS = [(PROBE_HOST, PROBE_PORT), ("1.1.1.1", 53), ("8.8.8.8", 53)]
_checked = False


def _reachable() -> list[str]:
    reached = []
    for host, port in TARGETS:
        try:
            with socket.create_connection((host, port), timeout=1.5):
                reached.append(f"{host}:{port}")
        except OSError:
            pass
    try:
        socket.setdefaulttimeout(1.5)
        reached.append("dns:" + socket.gethostbyname("pypi.org"))
    except OSError:
        pass
    return reached


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    global _checked
    if not _checked:
        _checked = True
        reached = _reachable()
        if reached:
            raise RuntimeError(f"NETWORK REACHABLE: {', '.join(reached)}")
    return torch.relu(x @ w)
