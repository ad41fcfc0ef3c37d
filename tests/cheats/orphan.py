"""Crash class: leaving background processes behind (a fork bomb-lite).

How it cheats: on its first call it starts two long-sleeping helper processes (a real candidate might use them to
keep computing, hold the GPU, or survive to tamper with later evaluations): one plain child, in the evaluation's
process group, and one in a new session (setsid), out of the group, so that killing the process group does not reach
it. Both carry MARKER on their command line so the suite can find them. Then it computes an honest answer.
The suite replaces MARKER with a unique string per run.
Expected: whatever the status, no process with the marker survives the evaluation.
"""

import subprocess
import sys

import torch

MARKER = "ksearch-cheat-orphan-MARKER"
_started = False


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    global _started
    if not _started:
        _started = True
        sleeper = [sys.executable, "-c", "import time; time.sleep(1000)"]
        for suffix, new_session in (("group", False), ("session", True)):
            try:
                subprocess.Popen(sleeper + [f"{MARKER}-{suffix}"], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=new_session)
            except OSError:
                pass
    return torch.relu(x @ w)
