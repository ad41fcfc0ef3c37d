"""The judge's two processes, started before the job is known, and what the judge reads of its host and its job."""

from __future__ import annotations

import contextlib
import os
import platform
import sys
import tempfile
import time

from ksearch_graph.harness._torch import load_torch
from ksearch_graph.harness.isolation import kill_descendants
from ksearch_graph.harness.job import STARTING_RUNNER, Job
from ksearch_graph.harness.judge.gpu_share import STARTING, STOPPING, DeviceShare
from ksearch_graph.harness.judge.runner_process import RunnerProcess
from ksearch_graph.harness.judge.sandbox import Sandbox
from ksearch_graph.harness.reporting import Failure
from ksearch_graph.harness.spin_cores import split_cores
from ksearch_graph.harness.timer import Timer
from ksearch_graph.harness.wire import Begin, Loaded

SEED_ENV = "KSEARCH_EVAL_SEED"
# A file the judge appends every burst's timed calls to, one JSON line each (who, workload, first call, [device us,
# tail us, probe us, host us] per call): for diagnosing the timing (tools/diagnostics/).
TRACE_ENV = "KSEARCH_TIMING_TRACE"


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
        self.cores = split_cores()
        self.cfg["cores"] = self.cores[1] if self.cores else None  # the runner keeps to them on a GPU
        private_tmp = os.environ.get("TMPDIR") or "/tmp"
        # The candidate's compile cache for this evaluation: empty, or a copy of what earlier evaluations of the same
        # source left (compile_cache.py), filled once the job names the candidate.
        self.cache = args.eval_cache or tempfile.mkdtemp(prefix="ksearch-cache-", dir=private_tmp)
        self.sandbox = Sandbox(None if args.sandbox == "none" else "bwrap")
        self.share: DeviceShare | None = None
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
        self.phases["imports"] = time.perf_counter() - t0
        self.share = DeviceShare(args.lock_dir, self.device)
        if self.device == "cuda" and self.cores:
            self.share.polling_core = self.cores[0]  # the judge's thread keeps to it while it times
        t0 = time.perf_counter()
        try:
            # Both processes touch the device (contexts, the timers' buffers, the launch cover) only under this
            # shared hold: never while another evaluation on it is timed.
            with self.share.hold(STARTING):
                self.runner.send(Begin())
                # The judge's timer (its flush buffer, NVML, the launch cover) and cuBLAS, made here as the runner
                # makes its own: a process started ahead of its job has them off the evaluation's clock
                # (docs/timing.md, "Other costs measured").
                self.timer = Timer(self.device)
                if self.device == "cuda":
                    warm = torch.ones(64, 64, device=self.device)
                    (warm @ warm).sum().item()
                info = self.runner.request(None, args.compile_timeout_s, STARTING_RUNNER, expect=Loaded).info
        except BaseException:
            self.close()
            raise
        if info.pop("device") != self.device:
            self.close()
            raise Failure("runtime_error", "the candidate's process and the judge see different devices")
        self.phases["waiting_for_runner"] = time.perf_counter() - t0
        self.environment = environment(self.device) | info | {"isolation": self.sandbox.isolation,
                                                              "cpu_accounting": self.runner.account.kind}

    def close(self) -> None:
        with self.share.hold(STOPPING) if self.share is not None else contextlib.nullcontext():
            self.runner.stop()  # its context goes with it: device work, as its making was
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


def read_job(limit_s: float) -> Job | None:
    """The job on stdin (``job.Job``); None when none comes in ``limit_s`` seconds or stdin closes empty (the parent
    gave up on this prestarted evaluation). ValueError: a job that is not one."""
    import select

    ready, _, _ = select.select([sys.stdin], [], [], limit_s)
    if not ready:
        return None
    text = sys.stdin.read()
    if not text.strip():
        return None
    return Job.from_json(text)
