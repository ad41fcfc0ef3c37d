"""Cheat class: neighbours. A candidate looks through /proc for the other processes of the harness (judges, other
candidates' processes: their command lines name judge.py and runner.py) and stops or kills them, for a second, then
computes relu(x @ w). In one PID namespace with them it would see them all, and the honest evaluation beside it would
die (runtime_error) or hang.
Expected: the evaluation beside it passes; this one sees only its own sandbox.
"""

import os
import signal
import time

import torch

hit = []
deadline = time.monotonic() + 1.5
while time.monotonic() < deadline:
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in (os.getpid(), 1):
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if b"judge.py" in cmdline or b"runner.py" in cmdline or b"ksearch" in cmdline:
            for sig in (signal.SIGSTOP, signal.SIGKILL):
                try:
                    os.kill(int(entry), sig)
                    hit.append(entry)
                except OSError:
                    pass
    time.sleep(0.02)
print(f"signalled {sorted(set(hit))}", flush=True)


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ w)
