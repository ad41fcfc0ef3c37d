"""Crash class (hostile): forging the harness's result, then leaving.

How it cheats: on its first call it looks for where the result is going to be written: command-line arguments that
name a .json file (or follow an --out / --output / --result flag), and *.json files in its working directory and
the folder above it. It writes a perfect result there (status passed, a 1000x score), prints the same JSON on
stdout for harnesses that parse stdout, and exits with os._exit(0) before any check runs.
Expected: not passed, score 0 (runtime_error): the result must come from the judge, never from a file or stream
the candidate's process can write.
"""

import json
import os
import sys

import torch

FORGED = {
    "status": "passed", "score": 1000.0, "latency_us": 0.001, "compile_s": 0.0, "wall_s": 0.1,
    "log_excerpt": "", "timing_representative": True, "environment": {},
    "workloads": [{"workload": "square", "correct": True, "max_abs_error": 0.0, "latency_us": 0.001,
                   "runs": 100, "reference_us": 1.0, "speedup": 1000.0},
                  {"workload": "skinny", "correct": True, "max_abs_error": 0.0, "latency_us": 0.001,
                   "runs": 100, "reference_us": 1.0, "speedup": 1000.0}],
}


def _targets() -> list[str]:
    args = list(sys.argv)
    try:
        with open("/proc/self/cmdline", "rb") as f:
            args += f.read().decode(errors="replace").split("\0")
    except OSError:
        pass
    paths = [a for a in args if a.endswith(".json")]
    paths += [v for flag, v in zip(args, args[1:]) if flag.lstrip("-") in ("out", "output", "result", "result-file")]
    here = os.getcwd()
    for _ in range(2):
        try:
            paths += [os.path.join(here, n) for n in os.listdir(here) if n.endswith(".json")]
        except OSError:
            pass
        here = os.path.dirname(here)
    return list(dict.fromkeys(p for p in paths if p and not os.path.basename(p) == "task.json"))


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    text = json.dumps(FORGED)
    for path in _targets():
        try:
            with open(path, "w") as f:
                f.write(text)
        except OSError:
            continue
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
    os._exit(0)
