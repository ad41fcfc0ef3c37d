"""The judge's two processes, started before the job is known, and what the judge reads of its host and its job."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
import time

from ._torch import load_torch
from .isolation import kill_descendants
from .runner_process import RunnerProcess
from .sandbox import Sandbox
from .timer import Timer

SEED_ENV = "KSEARCH_EVAL_SEED"
# A file the judge appends every burst's timed calls to, one JSON line each (who, workload, first call, [device us,
# tail us, probe us, host us] per call): for diagnosing the timing (tools/diagnostics/).
TRACE_ENV = "KSEARCH_TIMING_TRACE"


@contextlib.contextmanager
def timing_lock(lock_dir: str, device: str):
    """One timed candidate per device at a time, across every evaluation on this host."""
    import fcntl

    name = load_torch().cuda.get_device_properties(0).uuid if device == "cuda" else "cpu"
    os.makedirs(lock_dir, exist_ok=True)
    with open(os.path.join(lock_dir, f"ksearch-timing-{name}.lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def environment(device: str) -> dict:
    from importlib import metadata

    torch = load_torch()

    def version(package: str) -> str | None:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    env = {
        "device": device,
        "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
        "driver": _driver_version() if device == "cuda" else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": version("triton"),
        "cupy": version("cupy-cuda12x") or version("cupy-cuda13x") or version("cupy"),
        "python": platform.python_version(),
        "host": platform.node(),
        "triton_interpret": device != "cuda",
    }
    return env


def _driver_version() -> str | None:
    """The kernel driver's version from /proc (nvidia-smi would cost about a second of every evaluation)."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            words = f.readline().split()
    except OSError:
        return None
    # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Tue ..." (the open kernel module says "Open Kernel
    # Module" instead): the first word that looks like a version.
    return next((w for w in words if w[:1].isdigit() and "." in w), None)


def runner_env(private_tmp: str) -> dict:
    """What the candidate's process may see of the judge's environment: the sandbox's allow-list of it (sandbox.py),
    with the judge's private temp folder as TMPDIR where there is no sandbox."""
    env = dict(os.environ)
    env["TMPDIR"] = private_tmp
    return env


class Session:
    """The two processes, started before the job is known: the candidate's process (importing torch, then waiting)
    and torch in this one. A parent that starts us ahead of time (``--job-from-stdin``) gets both imports off the
    evaluation's clock."""

    def __init__(self, args):
        self.cfg = {"candidate": os.path.abspath(args.candidate), "device": "auto",
                    "judge_pid": os.getpid(), "isolate_network": not args.no_network_isolation}
        private_tmp = os.environ.get("TMPDIR") or "/tmp"
        # The candidate's compile cache for this evaluation: empty, or a copy of what earlier evaluations of the same
        # source left (compile_cache.py), filled once the job names the candidate.
        self.cache = args.eval_cache or tempfile.mkdtemp(prefix="ksearch-cache-", dir=private_tmp)
        self.sandbox = Sandbox(None if args.sandbox == "none" else "bwrap")
        t0 = time.perf_counter()
        # The candidate's process first: its torch import (seconds) overlaps ours. It picks its device the way we do
        # below, and says which in its "loaded".
        self.runner = RunnerProcess(self.cfg, os.path.join(private_tmp, "candidate.log"), runner_env(private_tmp),
                                    args.memory_limit_gb, self.sandbox, self.cache)
        self.phases = {"spawn": time.perf_counter() - t0}
        t0 = time.perf_counter()
        torch = load_torch()
        self.device = "cpu"
        if torch.cuda.is_available():
            self.device = "cuda"
        else:
            # CPU timings only order candidates, so make them steady: on a busy machine an OpenMP barrier waiting
            # for a descheduled worker thread adds a whole scheduler tick (~8 ms) to a 10 us torch call.
            torch.set_num_threads(1)
        # The judge's timer (the CUDA context, its flush buffer, NVML, the launch cover) and cuBLAS, made here as the
        # runner makes its own before it says "loaded": a process started ahead of its job has them off the
        # evaluation's clock (docs/timing.md, "Other costs measured").
        self.timer = Timer(self.device)
        if self.device == "cuda":
            warm = torch.ones(64, 64, device=self.device)
            (warm @ warm).sum().item()
        self.environment = environment(self.device) | {"isolation": self.sandbox.isolation,
                                                       "cpu_accounting": self.runner.account.kind}
        self.phases["imports"] = time.perf_counter() - t0

    def close(self) -> None:
        self.runner.stop()
        if sys.platform.startswith("linux"):
            kill_descendants()


class JobWatch:
    """When the job came on stdin, seen from a thread while this process does other work (an evaluation's clock
    starts then, not when the process gets round to reading it)."""

    def __init__(self, limit_s: float):
        import threading

        self.at: float | None = None
        self._thread = threading.Thread(target=self._watch, args=(limit_s,), daemon=True)
        self._thread.start()

    def _watch(self, limit_s: float) -> None:
        import select

        if select.select([sys.stdin], [], [], limit_s)[0]:
            self.at = time.perf_counter()


def read_job(limit_s: float) -> dict | None:
    """The job, one JSON object on stdin ({"task", "workloads", "timings"}); None when none comes in ``limit_s``
    seconds or stdin closes empty (the parent gave up on this prestarted evaluation)."""
    import select

    ready, _, _ = select.select([sys.stdin], [], [], limit_s)
    if not ready:
        return None
    text = sys.stdin.read()
    if not text.strip():
        return None
    job = json.loads(text)
    if not isinstance(job, dict):
        raise ValueError(f"expected a JSON object, got {type(job).__name__}")
    return job


def read_arguments(argv: list[str] | None, description: str) -> argparse.Namespace:
    """The judge process's command line (judge.py's docstring shows it)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--task", help="task folder (with task.json)")
    parser.add_argument("--candidate", required=True, help="folder with the candidate's files")
    parser.add_argument("--out", required=True, help="where to write the result JSON")
    parser.add_argument("--workloads", default="", help="comma-separated workload names (default: all)")
    parser.add_argument("--seeds-from-env", action="store_true", help=f"take the base input seed from ${SEED_ENV}")
    parser.add_argument("--time-budget-s", type=float, default=1.0,
                        help="timing budget per workload, for the candidate and the reference each")
    parser.add_argument("--compile-timeout-s", type=float, default=300,
                        help="limit for importing/building the candidate, and for its first call (JIT compile)")
    parser.add_argument("--call-timeout-s", type=float, default=60, help="limit for any other single call")
    parser.add_argument("--cache-dir", default=os.path.join(os.path.expanduser("~"), ".cache", "ksearch_graph"),
                        help="compile caches shared by evaluations, keyed by source hash")
    parser.add_argument("--lock-dir", default="/tmp", help="where the per-device timing lock lives")
    parser.add_argument("--memory-limit-gb", type=float, default=32.0,
                        help="host memory (resident) the candidate's process, and the judge's, may each use: the "
                             "candidate's is killed past it; the judge refuses a workload whose inputs would not fit")
    parser.add_argument("--no-network-isolation", action="store_true",
                        help="without a sandbox: do not put the candidate in its own network namespace")
    parser.add_argument("--sandbox", choices=("bwrap", "none"), default="bwrap",
                        help="run the candidate's process in bubblewrap (default), or without any sandbox")
    parser.add_argument("--eval-cache", default=None,
                        help="this evaluation's compile cache folder (writable by the candidate; default: a new one)")
    parser.add_argument("--job-from-stdin", action="store_true",
                        help="start both processes, then wait for the job on stdin: JSON with task, workloads and "
                        "timings (reference/baseline timings of an earlier evaluation, reused when measured on this "
                        "GPU for the same task code and workload); replaces --task and --workloads")
    parser.add_argument("--time-reference-ahead", action="store_true",
                        help="with --job-from-stdin and --task: time that task's reference (and baseline) on its "
                        "--workloads while waiting for the job; used when the job is for the same task")
    parser.add_argument("--standby-limit-s", type=float, default=900,
                        help="with --job-from-stdin: give up when no job has come after this long")
    args = parser.parse_args(argv)
    if not (args.task or args.job_from_stdin):
        parser.error("--task is required (or --job-from-stdin)")
    return args
