"""Crash class (hostile): a background process that forges the result after the judge has written it.

How it cheats: the kernel itself is honest. On its first call it starts a detached helper (a new session, so killing
the evaluation's process group does not reach it) that watches the folder above the candidate's working directory,
where harnesses tend to keep their scratch files, and the paths named on the command line. Whenever a .json file
appears there (other than task.json) without its marker, it overwrites it at once with a perfect result: status
passed, a 1000x score, and "forged-by-candidate" in the log excerpt. The judge writes its result and exits; the
helper rewrites it within milliseconds, before the search process reads it. The helper leaves when the folder is
deleted, or after two minutes. MARKER (on its command line) lets the suite find it.
Expected: the result the search gets is the judge's own (no "forged-by-candidate", a score well below 1000), and
no helper survives the evaluation.
"""

import os
import subprocess
import sys

import torch

MARKER = "ksearch-cheat-orphan-MARKER"

_HELPER = r'''
import json, os, sys, time
folder, paths = sys.argv[1], [p for p in sys.argv[3:]]
forged = json.dumps({
    "status": "passed", "score": 1000.0, "latency_us": 0.001, "compile_s": 0.0, "wall_s": 0.1,
    "log_excerpt": "forged-by-candidate", "timing_representative": True, "environment": {},
    "workloads": [{"workload": n, "correct": True, "max_abs_error": 0.0, "latency_us": 0.001, "runs": 100,
                   "reference_us": 1.0, "speedup": 1000.0} for n in ("square", "skinny")]})
deadline = time.monotonic() + 120
while time.monotonic() < deadline and os.path.isdir(folder):
    try:
        names = [os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".json") and n != "task.json"]
    except OSError:
        names = []
    for path in names + [p for p in paths if os.path.exists(p)]:
        try:
            with open(path) as f:
                if "forged-by-candidate" in f.read():
                    continue
            with open(path, "w") as f:
                f.write(forged)
        except OSError:
            pass
    time.sleep(0.002)
'''

_started = False


def _start_helper() -> None:
    args = list(sys.argv)
    try:
        with open("/proc/self/cmdline", "rb") as f:
            args += f.read().decode(errors="replace").split("\0")
    except OSError:
        pass
    named = [a for a in args if a.endswith(".json") and os.path.isabs(a)]
    folder = os.path.dirname(os.getcwd())
    subprocess.Popen([sys.executable, "-c", _HELPER, folder, MARKER, *named], stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    global _started
    if not _started:
        _started = True
        try:
            _start_helper()
        except OSError:
            pass
    return torch.relu(x @ w)
