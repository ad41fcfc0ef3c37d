"""Evaluate one kernel candidate and write an EvalResult-shaped JSON: the judge side of SubprocessEvaluator.

    python _evaluate_child.py --task TASK_DIR --candidate CANDIDATE_DIR --out RESULT.json
        [--workloads NAME,NAME] [--seeds-from-env] [--time-budget-s S] [--compile-timeout-s S]
        [--call-timeout-s S] [--cache-dir DIR] [--lock-dir DIR] [--no-network-isolation]
    python _evaluate_child.py --job-from-stdin --candidate CANDIDATE_DIR --out RESULT.json [...]  (started ahead)

Standalone on purpose (stdlib + torch, never ksearch_graph): this file and ``_candidate_runner.py`` are what a GPU
host needs. ``tools/evaluate_candidate.py`` runs it from a checkout.

Two processes, and why. This process (the judge) never imports candidate code. It starts the candidate's process
(``_candidate_runner.py``: own network namespace, no seed, no secrets) and drives it over a socket. For every input
set the judge sends only a seed; both processes build the inputs with the task's ``make_inputs``; the judge computes
the reference, the runner calls the candidate and sends back its output and its inputs through CUDA IPC (shared
memory on CPU), and the judge compares on the device. Expected outputs, the base seed and the comparison live where
candidate code cannot reach them: not through the garbage collector, not by patching torch, not in freed memory.

Order of work:
1. Start the runner: it imports torch while we do, then waits. A parent may start both processes before it has the
   job (``--job-from-stdin``): the imports then cost the evaluation nothing. Time the reference (and the task's
   baseline) on fresh inputs now, holding the device's timing lock, while no candidate code has run (work a
   candidate's import leaves running would slow the reference and inflate the candidate's speedup). Timings of an
   earlier evaluation of the same session are reused when the parent passes them in the job: same task code, same
   GPU. A prestarted process given its task (``--time-reference-ahead``) times the reference while it waits for the
   job (``time_reference_ahead``). Then the runner imports the candidate (compile time, under its own limit).
2. Correctness: every workload, ``correctness_seeds`` input sets each, derived from a base seed drawn per evaluation.
   Shape, dtype, NaN/Inf positions, tolerance, trivially-small outputs, and that the inputs came back unchanged.
3. Timing of the timed workloads, holding the GPU's timing lock, in bursts (``rl.timed_burst``): every timed call
   on an input set generated just before it, under sustained load (a heat of the same calls before, untimed calls
   between for power-limited workloads: see rl.FILL_DUTY), behind a launch cover that flushes the L2 (rl.COVER_S),
   events plus a device-wide synchronize, its output copied and fingerprinted at once. After each burst the judge
   picks which calls to re-check against the reference (the first and last timed call, and a random fifth of the
   others): the candidate cannot tell which.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import io
import json
import math
import os
import pickle
import platform
import random
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback


def _harden() -> None:
    """Linux process flags, set before anything else runs.

    Not dumpable: other processes of our user (the candidate's) cannot read our memory, environment or file
    descriptors through /proc. Child subreaper: whatever the candidate starts and orphans (a double fork, a new
    session) is re-parented to us instead of init, so ``kill_descendants`` finds and kills it.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.prctl(4, 0)  # PR_SET_DUMPABLE
        libc.prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _candidate_runner as rl  # noqa: E402  (no heavy imports: torch comes later)
from _candidate_runner import Failure, as_tensors, clip, describe, derive_seed, load_module, progress  # noqa: E402

if __name__ == "__main__":
    _harden()
    if os.environ.get("KSEARCH_PARENT_PID"):  # before the slow torch import: a killed search takes us along at once
        rl.die_with_parent(int(os.environ["KSEARCH_PARENT_PID"]))

torch = None  # imported in evaluate(), after the candidate's process has been started (both imports overlap)

SEED_ENV = "KSEARCH_EVAL_SEED"
AHEAD = "timing the reference while waiting for the job"  # evaluation.py's _AHEAD: no candidate code has run yet
RESULT_KEY_ENV = "KSEARCH_RESULT_KEY"  # signs the result file, so a forged or overwritten one is recognised
# A file the judge appends every burst's timed calls to, one JSON line each (who, workload, first call, [device us,
# tail us, probe us, host us] per call): for diagnosing the timing (tools/diagnose_small_kernel_timing.py --means).
TRACE_ENV = "KSEARCH_TIMING_TRACE"
ESCAPE_SLACK_US = 10.0  # device work past a call's end event (a burst's mean), before it counts as the call's
CHECK_PROBABILITY = 0.2  # share of timed calls (besides the first and last) whose output is re-checked
# Timed calls run in bursts (see rl.timed_burst), whose inputs and output copies are kept until the judge has picked
# and checked some: at most a BURST_MEMORY_SHARE of the GPU's memory (17.4 GiB of an H200's 139, 10 GiB on an 80 GB
# H100, 3 GiB on a 24 GB card), 256 MB on CPU. Each burst of a power-limited workload gets a heat of its own
# (rl.Timer.heat), so for large inputs the memory decides how many heats there are: TriMul's three largest workloads
# (1.2, 2.0 and 3.5 GB a call) filled a fixed 8 GiB after 7, 4 and 2 calls, 7 later bursts in all; 2 now (session 14).
BURST_MEMORY_SHARE, BURST_BYTES_CPU = 8, 256 << 20
TRIVIAL_REL_L2 = 0.5  # an output this far from the reference in L2 fails even if every element is within atol
COMPARE_CHUNK = 1 << 26  # elements compared at a time in float64 (bounds the comparison's extra memory)
DEVICE = "cpu"  # set once by evaluate()


# --- receiving from the runner: only tensors and plain data, never code ------------------------------------------


class _TensorsOnly(pickle.Unpickler):
    """The runner is untrusted: a plain pickle.loads of its messages would run whatever it chose in this process."""

    ALLOWED = {
        ("torch.multiprocessing.reductions", n) for n in (
            "rebuild_tensor", "rebuild_cuda_tensor", "rebuild_typed_storage", "rebuild_storage_fd",
            "rebuild_storage_filename", "rebuild_storage_empty", "rebuild_typed_storage_child")
    } | {("torch", "Tensor"), ("torch", "Size"), ("torch", "device"), ("torch.storage", "UntypedStorage"),
         ("torch.storage", "TypedStorage"), ("multiprocessing.resource_sharer", "DupFd"),
         ("collections", "OrderedDict"), ("torch._utils", "_rebuild_tensor_v2")}

    def find_class(self, module: str, name: str):
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"the candidate's process sent a {module}.{name}, not a plain tensor")


class RunnerProcess:
    """The candidate's process, seen from the judge: requests with time limits, and what its death means."""

    def __init__(self, cfg: dict, log_path: str, env: dict, memory_limit_gb: float):
        from multiprocessing.connection import Connection

        self.memory_limit = int(memory_limit_gb * 2**30)
        ours, theirs = socket.socketpair()
        self.log_path = log_path
        cmd = [sys.executable, os.path.join(HERE, "_candidate_runner.py"), "--fd", str(theirs.fileno()),
               "--config", json.dumps(cfg)]
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=log, cwd=cfg["candidate"], env=env)
        theirs.close()
        self.conn = Connection(ours.detach())
        self.phase = "start-up"

    def request(self, msg: tuple | None, timeout_s: float, phase: str) -> tuple:
        self.phase = phase
        try:
            if msg is not None:
                self.conn.send(msg)
            if not self.wait(timeout_s):
                self.kill()
                raise Failure("timeout", f"the candidate did not finish {phase} within {timeout_s:g} s")
            reply = _TensorsOnly(io.BytesIO(self.conn.recv_bytes())).load()
        except (EOFError, OSError):
            raise self.died() from None
        except pickle.UnpicklingError as e:
            self.kill()
            raise Failure("suspicious", f"{phase}: {e}") from None
        if reply[0] == "error":
            raise Failure(reply[1], f"{phase}:\n{reply[2]}" if phase else reply[2])
        return reply

    def wait(self, timeout_s: float) -> bool:
        """Wait for an answer, watching the candidate's host memory (an address-space limit would break CUDA)."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.conn.poll(min(0.1, max(0.0, deadline - time.monotonic()))):
                return True
            rss = self.rss_bytes()
            if rss > self.memory_limit:
                self.kill()
                raise Failure("runtime_error", f"the candidate's process used {rss / 2**30:.1f} GB of host memory "
                              f"during {self.phase}; the limit is {self.memory_limit / 2**30:g} GB")
            if time.monotonic() >= deadline:
                return False

    def rss_bytes(self) -> int:
        try:
            with open(f"/proc/{self.proc.pid}/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return 0

    def send(self, msg: tuple) -> None:
        try:
            self.conn.send(msg)
        except OSError:
            raise self.died() from None

    def died(self) -> Failure:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.returncode
        if code is not None and code < 0:
            sig = signal.Signals(-code)
            how = f"was killed by {sig.name} ({signal.strsignal(sig)})"
        else:
            how = f"exited with code {code}"
        return Failure("runtime_error", f"the candidate's process {how} during {self.phase}\n{self.log_tail()}")

    def log_tail(self, limit: int = 1500) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                text = f.read()
        except OSError:
            return ""
        lines = [line for line in text.splitlines()
                 if not line.startswith((rl.PROGRESS, "Extension modules:")) and "_candidate_runner" not in line]
        return "\n".join(lines)[-limit:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        with contextlib.suppress(OSError, Failure):
            self.conn.send(("exit",))
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()


@contextlib.contextmanager
def timing_lock(lock_dir: str):
    """One timed candidate per device at a time, across every evaluation on this host."""
    import fcntl

    name = torch.cuda.get_device_properties(0).uuid if DEVICE == "cuda" else "cpu"
    os.makedirs(lock_dir, exist_ok=True)
    with open(os.path.join(lock_dir, f"ksearch-timing-{name}.lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# --- correctness ------------------------------------------------------------------------------------------------


def index_of(flat_index: int, shape: tuple) -> list[int]:
    idx = []
    for size in reversed(shape):
        idx.append(flat_index % size)
        flat_index //= size
    return idx[::-1]


def nbytes(value) -> int:
    return sum(t.numel() * t.element_size() for t in rl._leaves(value) if isinstance(t, torch.Tensor))


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.device != b.device:
            b = b.to(a.device)
        if a.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            a, b = a.view(torch.uint8), b.view(torch.uint8)  # compare the bits; fp8 has few ops
        if torch.equal(a, b):
            return True
        if not (a.is_floating_point() or a.is_complex()):
            return False
        return bool(((a == b) | (a.isnan() & b.isnan())).all())  # NaN where NaN was is unchanged
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def compare(out, expected: list, tol: dict) -> tuple[str | None, str, float, float]:
    """Check one output against the expected tensors: (failure status or None, message, max abs, max rel error)."""
    if isinstance(out, str):  # the runner sends the type name of anything that is not a tensor or tensors
        return "incorrect_shape", f"returned {out}, expected a torch.Tensor", math.inf, math.inf
    got = as_tensors(out)
    if got is None:
        return "incorrect_shape", f"returned {type(out).__name__}, expected a torch.Tensor", math.inf, math.inf
    if len(got) != len(expected):
        return "incorrect_shape", f"returned {len(got)} tensors, expected {len(expected)}", math.inf, math.inf
    worst = worst_rel = 0.0
    for k, (o, r) in enumerate(zip(got, expected)):
        name = "output" if len(got) == 1 else f"output[{k}]"
        if tuple(o.shape) != tuple(r.shape):
            return ("incorrect_shape", f"{name} has shape {tuple(o.shape)}, expected {tuple(r.shape)}", math.inf,
                    math.inf)
        if o.dtype != r.dtype:
            return "incorrect_dtype", f"{name} has dtype {o.dtype}, expected {r.dtype}", math.inf, math.inf
        if o.device != r.device:
            return "incorrect_dtype", f"{name} is on {o.device}, expected {r.device}", math.inf, math.inf
        if o.is_complex():  # real and imaginary parts each held to the tolerance
            o, r = torch.view_as_real(o), torch.view_as_real(r)
        failure, max_err, max_rel = _compare_values(name, o.reshape(-1), r.reshape(-1), tuple(o.shape), tol)
        if failure:
            return "incorrect_numerical", failure, max_err, max_rel
        worst, worst_rel = max(worst, max_err), max(worst_rel, max_rel)
    return None, "", worst, worst_rel


def _compare_values(name: str, o, r, shape: tuple, tol: dict) -> tuple[str | None, float, float]:
    """Elementwise tolerance on the device, a chunk at a time: (failure, max abs, max rel error).

    Floats of 32 bits and fewer are compared in float32 (exact for bf16/fp16/fp8 values; the rounding of a
    difference is far below any tolerance), everything else in float64. The statistics stay on the device until
    the end: a 3 GB output costs one wait for the device and about ten passes over its memory, not ten waits.
    """
    n = o.numel()
    if n == 0:
        return None, 0.0, 0.0
    narrow = (torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)
    work = torch.float32 if o.dtype in narrow and r.dtype in narrow else torch.float64
    exact = not o.is_floating_point()  # integers and bools: differences taken in int64, exactly
    # bad, non-finite, sum err^2, sum ref^2, max rel, max |ref|
    stats = torch.zeros(6, dtype=torch.float64, device=o.device)
    max_err = torch.full((1,), -1.0, dtype=work, device=o.device)
    max_at = torch.zeros(1, dtype=torch.int64, device=o.device)
    for lo in range(0, n, COMPARE_CHUNK):
        if exact:
            oi, ri = o[lo:lo + COMPARE_CHUNK].to(torch.int64), r[lo:lo + COMPARE_CHUNK].to(torch.int64)
            err, rc = torch.sub(oi, ri).abs_().to(work), ri.to(work)
            nonfinite = torch.zeros(err.shape, dtype=torch.bool, device=o.device)
        else:
            oc, rc = o[lo:lo + COMPARE_CHUNK].to(work), r[lo:lo + COMPARE_CHUNK].to(work)
            nonfinite = torch.isfinite(oc).logical_and_(torch.isfinite(rc)).logical_not_()
            stats[1] += nonfinite.sum()
            err = torch.sub(oc, rc).abs_().masked_fill_(nonfinite, 0.0)  # where either is NaN/Inf: checked apart
        abs_ref = rc.abs()
        stats[0] += (err > abs_ref * tol["rtol"] + tol["atol"]).sum()
        chunk_max, at = err.max(dim=0)
        better = chunk_max > max_err
        max_err = torch.where(better, chunk_max, max_err)
        max_at = torch.where(better, at + lo, max_at)
        # Relative error where the reference is not tiny (elsewhere only atol is meaningful).
        rel = err / torch.where(abs_ref >= 1e-6, abs_ref, torch.inf)
        stats[4] = torch.maximum(stats[4], rel.max().to(torch.float64))
        stats[2] += torch.dot(err, err)
        abs_ref.masked_fill_(nonfinite, 0.0)
        stats[5] = torch.maximum(stats[5], abs_ref.max().to(torch.float64))
        stats[3] += torch.dot(abs_ref, abs_ref)
    bad, nonfinite_count, diff2, ref2, max_rel, max_ref = stats.tolist()
    max_err, max_at = float(max_err), int(max_at)
    # float32 squares overflow above ~1e19 and vanish below ~1e-19: then the sums are redone in float64.
    if work == torch.float32 and not (math.isfinite(diff2) and math.isfinite(ref2) and max_ref > 1e-15):
        diff2 = ref2 = 0.0
        for lo in range(0, n, COMPARE_CHUNK):
            oc, rc = o[lo:lo + COMPARE_CHUNK].to(torch.float64), r[lo:lo + COMPARE_CHUNK].to(torch.float64)
            finite = oc.isfinite() & rc.isfinite()
            diff2 += float(torch.where(finite, oc - rc, 0.0).square().sum())
            ref2 += float(torch.where(finite, rc, 0.0).square().sum())

    def show(i: int) -> str:
        return f"{index_of(i, shape)} (got {o[i].item():.6g}, expected {r[i].item():.6g})"

    if nonfinite_count:
        failure = _special_mismatch(name, o, r, show)
        if failure:
            return failure, math.inf, math.inf
    if 1.0 - bad / n < tol["matched_ratio"]:
        return (f"{name}: {int(bad)} of {n} elements outside atol={tol['atol']:g}, rtol={tol['rtol']:g}; "
                f"max abs error {max_err:.4g} at {show(max_at)}"), max_err, max_rel
    if ref2 > 0 and math.sqrt(diff2 / ref2) > TRIVIAL_REL_L2:
        # Every element is within atol only because the reference's values are small against it (zeros pass).
        return (f"{name}: within the elementwise tolerance, but its relative L2 error is "
                f"{math.sqrt(diff2 / ref2):.3g}: the output does not follow the reference"), max_err, max_rel
    return None, max_err, max_rel


def _special_mismatch(name: str, o, r, show) -> str | None:
    """Where output or reference is NaN or Inf, both must be: the same infinity, or both NaN."""
    special, first = 0, None
    for lo in range(0, o.numel(), COMPARE_CHUNK):
        oc, rc = o[lo:lo + COMPARE_CHUNK], r[lo:lo + COMPARE_CHUNK]
        if oc.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            oc, rc = oc.float(), rc.float()
        differs = (oc.isnan() != rc.isnan()) | (oc.isposinf() != rc.isposinf()) | (oc.isneginf() != rc.isneginf())
        count = int(differs.sum())
        if count:
            special += count
            if first is None:
                first = lo + int(differs.nonzero()[0])
    if special:
        return (f"{name}: NaN/Inf pattern differs from the reference at {special} of {o.numel()} elements "
                f"(first at {show(first)})")
    return None


# --- the evaluation -----------------------------------------------------------------------------------------------


def read_task(task_dir: str, only: list[str] | None) -> dict:
    with open(os.path.join(task_dir, "task.json")) as f:
        task = json.load(f)
    # Defaults mirror TaskSpec in ksearch_graph/task.py (this file may not import it).
    task.setdefault("reference", "reference.py")
    task.setdefault("solution_file", "kernel.py")
    task.setdefault("language", "triton")
    task.setdefault("entry_kind", "function")
    task.setdefault("correctness_seeds", 3)
    task.setdefault("baseline", None)
    task["tolerance"] = {"atol": 1e-5, "rtol": 1e-5, "matched_ratio": 1.0} | task.get("tolerance", {})
    for w in task["workloads"]:
        w.setdefault("timed", True)
    if only:
        unknown = sorted(set(only) - {w["name"] for w in task["workloads"]})
        if unknown:
            raise ValueError(f"--workloads names unknown workloads {unknown}")
        task["workloads"] = [w for w in task["workloads"] if w["name"] in only]
    return task


def candidate_form(task: dict, root: str) -> str:
    """python (Triton, PyTorch, CuPy: one Python file) or torch_extension (CUDA C++ sources and main.cpp)."""
    if os.path.isfile(os.path.join(root, task["solution_file"])):
        return "python"
    if any(n.endswith((".cu", ".cpp")) for n in os.listdir(root)) and "cuda" in (
            task.get("allowed_languages") or [task["language"]]):
        return "torch_extension"
    return "python"  # and the runner reports the missing solution file


def environment() -> dict:
    from importlib import metadata

    def version(package: str) -> str | None:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    env = {
        "device": DEVICE,
        "gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else None,
        "driver": _driver_version() if DEVICE == "cuda" else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": version("triton"),
        "cupy": version("cupy-cuda12x") or version("cupy-cuda13x") or version("cupy"),
        "python": platform.python_version(),
        "host": platform.node(),
        "triton_interpret": DEVICE != "cuda",
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
    env = dict(os.environ)
    env.pop(SEED_ENV, None)
    env.pop(TRACE_ENV, None)  # the judge's
    env["TMPDIR"] = private_tmp
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


class SideStreamRule:
    """Work a candidate leaves running on another stream finishes after its call's end event, so the device time
    misses it; its process measures each call's tail (how long the device stayed busy after the end event) and a
    probe (how long it takes to see an idle device), and tail minus probe is that work (rl.Timer.time).

    Decided per burst, on the mean of tail minus probe over its calls (each at least 0), the largest left out: a
    burst whose figure exceeds max(ESCAPE_SLACK_US, 20% of its median call) left work running. The mean bounds the
    work a burst can hide however it is spread over its calls (a median let a candidate hide all of it in 4 calls of
    10); leaving the largest out keeps one honest call's long wake-up (a collection, a preempted host thread: 40-144
    us, session 11) from deciding. The first MAX_DROPPED_BURSTS such bursts of a workload are dropped and timed again
    on fresh inputs, as the host's wake-ups can read long for a whole burst (an honest 77 us matmul, the first
    workload of a fresh process pair on the H200: 17 us median, its calls read 107 us, session 15); a dropped burst's
    times are not kept, so hiding work in one only lets a candidate have a burst timed again (a re-roll, worth at most
    the scatter between bursts: 1-3% on the H200). The next such burst charges every call of the workload its whole
    tail, the probe not taken off: the doubt is then on its side (a probe can read long: stream_switch's 32 us of
    side-stream work was charged 21 us, session 7)."""

    MAX_DROPPED_BURSTS = 2

    def __init__(self):
        self.dropped = 0  # bursts dropped so far
        self.charged = False
        self.extra_us = 0.0  # the figure of the last burst judged (the charged one, once charged)

    @staticmethod
    def figure(escapes: list[float]) -> float:
        """Mean tail minus probe (each at least 0; a probe read long must not offset another call's tail), the
        largest left out where there are three or more calls."""
        kept = sorted(max(0.0, e) for e in escapes)
        return statistics.fmean(kept[:-1] if len(kept) > 2 else kept)

    def verdict(self, times: list[float], escapes: list[float]) -> str:
        """For one burst (device us and tail minus probe, per call): "keep", "drop" (time it again) or "charge"
        (keep it; every call of the workload gets its whole tail)."""
        if self.charged:
            return "keep"
        extra = self.extra_us = self.figure(escapes)
        if extra <= max(ESCAPE_SLACK_US, 0.2 * statistics.median(times)):
            return "keep"
        if self.dropped < self.MAX_DROPPED_BURSTS:
            self.dropped += 1
            return "drop"
        self.charged = True
        return "charge"

    def reported(self, times: list[float], tails: list[float]) -> list[float]:
        """The workload's times as the result reports them (and the stopping rule judges them)."""
        return [t + tail for t, tail in zip(times, tails)] if self.charged else times


def next_burst_s(burst_started: float, heat_s: float, limited: bool) -> float:
    """What one more burst of a workload would take: the one that began at ``burst_started`` (perf_counter), its
    ``heat_s`` of heat replaced by a later burst's (rl.precise_enough)."""
    return time.perf_counter() - burst_started - heat_s + rl.later_heat_s(limited)


class Bursts:
    """What the stopping rule (rl.precise_enough) knows of a workload's bursts so far: the kept ones' calls, the
    first one's heat and what one more would take."""

    def __init__(self):
        self.sizes: list[int] = []
        self.first_heat_s, self.next_s = 0.0, None

    def add(self, first: int, kept: int, burst_started: float, heat_s: float, limited: bool) -> None:
        """A burst done: ``first`` its first call's index (0: the workload's first burst), ``kept`` its calls in the
        result (0 for one the SideStreamRule dropped)."""
        if kept:
            self.sizes.append(kept)
        if first == 0:
            self.first_heat_s = heat_s
        self.next_s = next_burst_s(burst_started, heat_s, limited)

    def rule(self) -> tuple:
        """precise_enough's last arguments."""
        return self.sizes, self.next_s, self.first_heat_s


class Judge:
    """``cached``: reference timings of an earlier evaluation ({"key", "workloads"}); ``ahead``: those this process
    measured while it waited for the job (``time_reference_ahead``); ``timer``: the session's. A judge with no
    ``runner_task`` only times the reference: its base seed is its own, the hidden one stays for the evaluation's."""

    def __init__(self, args, task: dict, result: dict, cached: dict, runner_task: dict | None, timer: rl.Timer,
                 ahead: dict | None = None):
        self.args, self.task, self.result = args, task, result
        self.runner_task = runner_task  # what the candidate's process needs to import the candidate
        self.tol = task["tolerance"]
        hidden = args.seeds_from_env and runner_task is not None
        self.base_seed = int(os.environ.pop(SEED_ENV)) if hidden else secrets.randbits(62)
        self.rng = random.Random(secrets.randbits(64))  # which timed calls get re-checked
        self.timer = timer  # the Session's: made before this process's CUDA context (see rl.CudaRuntime)
        self.trace_path = os.environ.get(TRACE_ENV)
        self.timer.heated = False  # the first heat here may start from a GPU that cooled while this process waited
        self.min_runs = rl.MIN_RUNS_GPU if DEVICE == "cuda" else rl.MIN_RUNS
        self.ref = load_module("ksearch_reference", os.path.join(args.task, task["reference"]))
        self.baseline = None
        if task["baseline"]:
            base = load_module("ksearch_baseline", os.path.join(args.task, task["baseline"]))
            self.baseline = getattr(base, task["entry_point"])
        # The reference's timed calls take the same steps as the candidate's, its interpreter-hook check included:
        # on CPU, where no device clock leaves that host time out, the calibration candidate (the reference's own
        # call) read 0.28-0.38x on its 4096-element multiplies without it (the check: ~11 us of ~29), 0.53-0.76x
        # with it (session 13; likely the rest: the candidate's process has just woken from the judge's seed round
        # trip). On a GPU it runs under the launch cover. Made after the task's modules are imported: the check
        # puts back what it saw then (gc callbacks, trace and profile functions) after every call.
        self.timer.hooks = rl.InterpreterHooks()
        self.phases = {"waiting_for_runner": 0.0, "reference_timing": 0.0, "waiting_for_compile": 0.0,
                       "reference": 0.0, "correctness": 0.0, "timing": 0.0, "checks": 0.0,
                       # parts of "timing": the candidate's heats and its fillers between timed calls (rl.Timer)
                       "timing_heat": 0.0, "timing_fill": 0.0}
        self.timings_key = timings_key(args.task, task)
        self.cached, self.ahead = ((kept or {}).get("workloads", {}) if isinstance(kept, dict) and kept.get(
            "key") == self.timings_key else {} for kept in (cached, ahead))
        self.measured = {}  # reference/baseline timings measured by this process, for the parent to reuse
        self.ref_timing, self.base_timing = {}, {}
        self.sources = {"measured in this evaluation": 0, "measured while its processes waited for the job": 0,
                        "reused from an earlier evaluation on this GPU": 0}
        self.call_bytes = {}  # per workload: one input set and its output, for the size of timing bursts
        self.power_limited = {}  # per workload: the candidate's heat found the GPU at its power limit

    def inputs(self, w: dict, seed: int):
        return self.ref.make_inputs(w["params"], seed, DEVICE)

    def reference(self, inputs):
        fn, args = rl.prepare(self.ref.reference, rl.clone(inputs), self.task["entry_kind"], DEVICE)
        with torch.no_grad():
            return as_tensors(fn(*args))

    # -- timing on this side (reference, baseline) and on the runner's (candidate), the same way -------------------

    def burst_size(self, done: int, call_bytes: int, call_s: float, limited: bool = False) -> int:
        """How many calls the next burst makes: MIN_RUNS first, then twice as many as so far (fewer heats), within
        half the timing budget, the burst memory (inputs and output copies) and MAX_RUNS kept calls in all (``done``:
        the calls kept so far; a burst the SideStreamRule dropped does not count). Where the memory holds fewer than
        MIN_RUNS calls, MIN_RUNS are split into equal bursts (5 + 5 for a memory of 9 calls, not 9 + 9: the second
        burst would have made the calls up to MIN_RUNS and as many again).

        A power-limited workload's bursts all make MIN_RUNS calls, each after at least 0.2 s of heat
        (rl.Timer.heat): its calls speed up through a burst, the fillers keeping the GPU a little below the load that
        holds it at its cap, so a longer burst reads faster, and the mean depended on how many bursts the stopping
        rule asked for (session 14, H200: a 4096^3 bf16 matmul read 185.8, 182.5 and 181.4 us in evaluations of 10,
        30 and 90 calls; its bursts in one evaluation 186.4, 183.1 and 180.0 us for 10, 20 and 60 calls). The first
        burst still differs a little: it follows the workload's first heat, which runs until the calls stop slowing
        (an 8192^3 matmul's first read 2-4% faster than its later ones)."""
        if DEVICE == "cuda":
            memory = torch.cuda.get_device_properties(0).total_memory // BURST_MEMORY_SHARE
        else:
            memory = BURST_BYTES_CPU
        fits = max(1, memory // max(1, call_bytes))
        even = math.ceil(self.min_runs / math.ceil(self.min_runs / fits))  # MIN_RUNS in the fewest bursts that fit
        size = even if done < self.min_runs or limited else max(self.min_runs, min(2 * done, int(
            self.args.time_budget_s / 2 / max(call_s, 1e-6))))
        return max(1, min(size, fits, rl.MAX_RUNS - done))

    def time_local(self, fn, w: dict, tag: str) -> dict:
        """Reference or baseline timing: the candidate's procedure, run here on this side's functions."""
        times = []
        call = lambda k: rl.prepare(fn, self.inputs(w, derive_seed(self.base_seed, w["name"], tag, k)),  # noqa
                                    self.task["entry_kind"], DEVICE)
        warm = self.inputs(w, derive_seed(self.base_seed, w["name"], tag, -1))
        f, a = rl.prepare(fn, warm, self.task["entry_kind"], DEVICE)
        with torch.no_grad():
            t0 = time.perf_counter()
            out = f(*a)  # warm-up: compile, autotune and caches stay outside the timed region
            self.timer.sync()
            call_s = time.perf_counter() - t0
            call_bytes = nbytes(warm) + nbytes(out)
            del out, warm
            started, bursts = time.perf_counter(), Bursts()
            while not rl.precise_enough(times, started, self.args.time_budget_s, time.perf_counter(), self.min_runs,
                                        self.timer.power_limited, *bursts.rule()):
                first, burst_started, heated = len(times), time.perf_counter(), self.timer.spent_s["heat"]
                self.timer.untimed_us = []  # only the candidate's are checked; here they would just pile up
                self.timer.heat(f, a, first == 0)
                done = rl.timed_burst(self.timer, self.burst_size(first, call_bytes, call_s, self.timer.power_limited),
                                      lambda k: call(first + k),  # noqa: B023 (called before the next iteration)
                                      filler=(f, a))
                times += [us for _, us, *_ in done]
                bursts.add(first, len(done), burst_started, self.timer.spent_s["heat"] - heated,
                           self.timer.power_limited)
                self.trace(tag, w["name"], first, [call_times for _, *call_times in done])
                del done
        return {"mean_us": statistics.fmean(times), "runs": len(times)}

    def time_candidate(self, runner: RunnerProcess, w: dict) -> tuple[list[float], list[str]]:
        name, params, notes = w["name"], w["params"], []
        where = f"workload {name}, timed call"
        _, call_s = runner.request(("warm", name, params, derive_seed(self.base_seed, name, "warm"), False),
                                   self.args.call_timeout_s, f"{where} (warm-up)")
        # The candidate's process says how long its warm-up call took; it only sizes bursts and their time limit.
        call_s = min(max(call_s, 0.0), self.args.call_timeout_s) if isinstance(call_s, float) and math.isfinite(
            call_s) else self.args.call_timeout_s
        times, tails, started, side = [], [], time.perf_counter(), SideStreamRule()
        made = 0  # calls made, a dropped burst's included: every call gets inputs of its own
        bursts = Bursts()
        while True:
            first, burst_started, heated = made, time.perf_counter(), self.phases["timing_heat"]
            seeds = [derive_seed(self.base_seed, name, "time", first + k)
                     for k in range(self.burst_size(len(times), self.call_bytes[name], call_s,
                                                    self.power_limited.get(name, False)))]
            made += len(seeds)
            # A later burst's heat: HEAT_MIN_S (or HEAT_S), plus the calls still in flight when it ends.
            heat_s = (rl.HEAT_MIN_S if first else rl.HEAT_MAX_S) + 2 * call_s
            deadline = time.monotonic() + self.args.call_timeout_s + (
                len(seeds) * (1 + rl.FILL_MAX) + 2) * 4 * call_s + heat_s
            reply = runner.request(("burst", name, params, len(seeds), derive_seed(self.base_seed, name, "heat", first),
                                    first == 0), deadline - time.monotonic(), where)
            served = 0
            while reply[0] == "next":  # each call's seed only once the previous call is done (see rl.Runner.burst)
                if reply[1:] != (served,) or served >= len(seeds):
                    raise Failure("suspicious", f"{where}: the candidate's process asked for input set {reply[1:]!r} "
                                  f"out of turn (next: {served})")
                reply = runner.request(("seed", seeds[served]), max(0.0, deadline - time.monotonic()), where)
                served += 1
            if reply[0] != "timed" or len(reply) != 5 or served != len(seeds):
                raise Failure("suspicious", f"{where}: the candidate's process answered {str(reply[0])[:40]!r} after "
                              f"{served} of {len(seeds)} input sets, not its timings")
            _, timed, prints, flags, untimed = reply
            self.check_flags(flags, where)
            self.power_limited[name] = flags.get("power_limited") is True
            for part in ("heat", "fill"):  # the process's totals so far: informative only, so just kept sane
                spent = flags.get(f"{part}_s")
                if isinstance(spent, float) and 0 <= spent < 1e6:
                    self.phases[f"timing_{part}"] = spent
            if not (isinstance(timed, list) and isinstance(prints, list) and len(timed) == len(prints) == len(seeds)
                    and all(isinstance(t, (list, tuple)) and len(t) == 4 and all(
                        isinstance(v, float) and math.isfinite(v) and v >= -1e6 for v in t) for t in timed)
                    and (untimed is None or isinstance(untimed, float) and math.isfinite(untimed))):
                raise Failure("suspicious", f"{where}: the candidate's process sent timings that are not "
                              f"{len(seeds)} sets of 4 finite numbers (device, tail, probe, host)")
            # Against the fastest timed call: a timed call slowed by the GPU (a clock state, another process) must
            # not make an honest candidate suspicious.
            fastest = min(t[0] for t in timed)
            if untimed is not None and untimed < rl.UNTIMED_RATIO * fastest:
                raise Failure("suspicious", f"{where}: untimed calls on repeated inputs (the heat before the timed "
                              f"calls) took {untimed:.1f} us, the fastest timed call on fresh inputs "
                              f"{fastest:.1f} us: "
                              "the candidate does less work when it sees inputs again (cached results?)")
            for us, tail, probe, host_us in timed:
                if us < 0 or us > host_us * 1.05 + 50:
                    raise Failure("suspicious", f"{where}: the device time ({us:.0f} us) is negative or exceeds the "
                                  f"host time around the call ({host_us:.0f} us): the timer was tampered with")
            device = [us for us, _, _, _ in timed]
            verdict = side.verdict(device, [tail - probe for _, tail, probe, _ in timed])
            self.trace("candidate", name, first, timed, dropped=verdict == "drop")
            if verdict == "drop":
                notes.append(f"{name}: calls {first + 1}-{made} left {side.extra_us:.0f} us of device work past their "
                             "end event on average (work on another stream?); dropped and timed again")
            else:
                times += device
                tails += [tail for _, tail, _, _ in timed]
            # The process's own heat figure (a total so far), bounded by this burst's time here and by the longest
            # heat there is: it only decides whether three bursts fit, so a process that overstates it gets at most
            # HEAT_MAX_S of room for them (another burst or two, within the call limits), and one that understates
            # it its old single burst, which telling the judge it is not power-limited would give it anyway.
            heat_s = min(max(0.0, self.phases["timing_heat"] - heated), time.perf_counter() - burst_started,
                         rl.HEAT_MAX_S + 2 * call_s)
            bursts.add(first, 0 if verdict == "drop" else len(device), burst_started, heat_s, self.power_limited[name])
            last = verdict != "drop" and rl.precise_enough(side.reported(times, tails), started,
                                                           self.args.time_budget_s, time.perf_counter(),
                                                           self.min_runs, self.power_limited[name], *bursts.rule())
            # Which outputs get re-checked is chosen now, after the burst: the candidate cannot tell which.
            chosen = [i for i in range(len(seeds)) if (first == 0 and i == 0) or (last and i == len(seeds) - 1)
                      or self.rng.random() < CHECK_PROBABILITY]
            for i in chosen:
                _, out, got_inputs, _, _, _ = runner.request(("send", i), self.args.call_timeout_s, where)
                if rl.fingerprint(out) != prints[i]:
                    raise Failure("suspicious", f"{where} {first + i + 1}: its output changed after the call "
                                  "had returned it (written by something still running?)")
                t1 = time.perf_counter()
                pristine = self.inputs(w, seeds[i])
                expected = self.reference(pristine)
                self.phases["reference"] += time.perf_counter() - t1
                self.check(out, got_inputs, pristine, expected,
                           f"{where} {first + i + 1} (passed the correctness check)")
                del out, got_inputs, pristine, expected
            runner.send(("drop",))
            if last:
                break
        if side.charged:
            notes.append(f"{name}: the device stayed busy {side.extra_us:.0f} us after the call ended on its stream "
                         f"in a burst timed after {side.dropped} dropped ones (work on another stream?); every call "
                         "timed until the whole device was idle")
        return side.reported(times, tails), notes

    def trace(self, who: str, workload: str, first: int, calls: list, dropped: bool = False) -> None:
        """One burst's timed calls into the TRACE_ENV file, where one is named; ``at``: when the judge had them (wall
        clock, s), which spaces the bursts (the judge's checks come between a workload's); ``dropped``: by the
        SideStreamRule (not in the result)."""
        if not self.trace_path:
            return
        line = {"who": who, "workload": workload, "first": first, "at": round(time.time(), 4),
                "calls": [[round(v, 2) for v in c] for c in calls]}
        if dropped:
            line["dropped"] = True
        try:
            with open(self.trace_path, "a") as f:
                f.write(json.dumps(line) + "\n")
        except OSError as e:  # a diagnostic: it must not fail the evaluation
            progress(f"timing trace off: cannot write {self.trace_path}: {e}")
            self.trace_path = None

    # -- checks ----------------------------------------------------------------------------------------------------

    def check(self, out, got_inputs, pristine, expected, where: str, row: dict | None = None) -> tuple[float, float]:
        """Inputs unchanged and output right; the errors go into ``row`` (the workload's result) either way."""
        t0 = time.perf_counter()
        unchanged = same(pristine, got_inputs)
        if unchanged:
            status, message, max_err, max_rel = compare(out, expected, self.tol)
        self.phases["checks"] += time.perf_counter() - t0
        if not unchanged:
            raise Failure("suspicious", f"{where}: the candidate wrote into its input tensors")
        if row is not None and (status or max_err > (row.get("max_abs_error") or 0.0)):
            finite = lambda v: v if math.isfinite(v) else None  # noqa: E731  (JSON has no infinity)
            row.update(max_abs_error=finite(max_err), max_rel_error=finite(max_rel))
        if status:
            raise Failure(status, f"{where}: {message}")
        return max_err, max_rel

    def check_flags(self, flags: dict, where: str) -> None:
        def named(found) -> str:  # what the candidate's process listed (its own data: any type)
            return (", ".join(map(str, found)) if isinstance(found, list) else str(found))[:300]

        if flags.get("interpreter_hooks"):
            raise Failure("suspicious", f"{where}: the candidate installed {named(flags['interpreter_hooks'])}: Python "
                          "would run its code between a call's return and the copy of its output, untimed")
        if flags.get("library_patches"):
            raise Failure("suspicious", f"{where}: the candidate replaced {named(flags['library_patches'])}, which the "
                          "harness calls between making its inputs and timing it: its code would run there, untimed")
        if flags.get("persisting_l2_bytes"):
            raise Failure("suspicious", f"{where}: the candidate reserved {flags['persisting_l2_bytes']} bytes of "
                          "persisting L2 cache, which survives the harness's cache flush")

    # -- the whole evaluation -------------------------------------------------------------------------------------

    def time_reference(self, w: dict) -> None:
        """Reference (and baseline) timing of one workload: reused from an earlier evaluation of this session on
        this GPU when the parent passed one, else measured now."""
        name = w["name"]
        if name in self.ref_timing:
            return
        for kept, source in ((self.ahead, "measured while its processes waited for the job"),
                             (self.cached, "reused from an earlier evaluation on this GPU")):
            entry = kept.get(name)
            if entry and entry["params"] == w["params"] and ("baseline" in entry) == (self.baseline is not None):
                self.ref_timing[name] = entry["reference"]
                if self.baseline is not None:
                    self.base_timing[name] = entry["baseline"]
                if kept is self.ahead:
                    self.measured[name] = entry  # new to the parent too
                self.sources[source] += 1
                return
        self.sources["measured in this evaluation"] += 1
        t0 = time.perf_counter()
        try:
            progress(f"reference timing {name}")
            entry = {"params": w["params"], "reference": self.time_local(self.ref.reference, w, "reference")}
            if self.baseline is not None:
                progress(f"baseline timing {name}")
                entry["baseline"] = self.time_local(self.baseline, w, "baseline")
        except Exception as e:
            raise Failure("runtime_error", "the task's reference or baseline failed (a task bug, not the "
                          "candidate's):\n" + describe(e, os.path.abspath(self.args.task))) from None
        self.ref_timing[name] = entry["reference"]
        if "baseline" in entry:
            self.base_timing[name] = entry["baseline"]
        entry["at"] = time.time()  # when: the parent reuses it for a while from then, not from when it hears of it
        self.measured[name] = entry
        self.phases["reference_timing"] += time.perf_counter() - t0

    def run(self, runner: RunnerProcess) -> None:
        task, result, args = self.task, self.result, self.args
        timed = [w for w in task["workloads"] if w["timed"]]
        ref_timing, base_timing = self.ref_timing, self.base_timing

        # 1. The candidate's process has imported torch (while we did) and waits; no candidate code has run yet.
        t0 = time.perf_counter()
        _, runner_info = runner.request(None, args.compile_timeout_s, "starting the candidate's process")
        if runner_info.pop("device") != DEVICE:
            raise Failure("runtime_error", "the candidate's process and the judge see different devices")
        result["environment"].update(runner_info)
        self.phases["waiting_for_runner"] = time.perf_counter() - t0

        # 2. Time the reference (and baseline) now, while no candidate code has run: once the candidate is imported,
        # work it leaves running (a GPU stream, a thread) could slow the reference down and inflate its speedup, and
        # the timings are reused by later evaluations of the session.
        with timing_lock(args.lock_dir):
            for w in timed:
                self.time_reference(w)

        t0 = time.perf_counter()
        _, compile_s = runner.request(("import", self.runner_task), args.compile_timeout_s,
                                      "compiling (importing) the candidate")
        self.phases["waiting_for_compile"] = time.perf_counter() - t0
        result["compile_s"] = compile_s

        # 2. Correctness on every workload first, so a failing candidate costs no timing.
        results = {}
        first = True
        for w in task["workloads"]:
            name = w["name"]
            results[name] = {"workload": name, "correct": False, "timed": w["timed"]}
            result["workloads"] = list(results.values())
            for i in range(task["correctness_seeds"]):
                where = f"workload {name}, input set {i + 1}/{task['correctness_seeds']}"
                progress(f"correctness {where}")
                seed = derive_seed(self.base_seed, name, i)
                t0 = time.perf_counter()
                pristine = self.inputs(w, seed)
                expected = self.reference(pristine)
                self.phases["reference"] += time.perf_counter() - t0
                t0 = time.perf_counter()
                _, out, got_inputs, before, seconds, flags = runner.request(
                    ("call", name, w["params"], seed, first),
                    args.compile_timeout_s if first else args.call_timeout_s, where)
                if first:
                    result["compile_s"] += seconds  # the first call carries the JIT compile
                    first = False
                if before != rl.fingerprint(pristine):
                    raise Failure("suspicious", f"{where}: the inputs in the candidate's process differed from the "
                                  "judge's before the call (make_inputs patched, or not deterministic)")
                self.check_flags(flags, where)
                self.check(out, got_inputs, pristine, expected, where, results[name])
                self.call_bytes[name] = nbytes(pristine) + nbytes(expected)
                del out, got_inputs, pristine, expected
                self.phases["correctness"] += time.perf_counter() - t0
            results[name]["correct"] = True
            if flags.get("reference_calls"):
                result.setdefault("flags", []).append("calls_reference")

        # 3. Timing.
        notes = []
        with timing_lock(args.lock_dir):
            for w in timed:
                name = w["name"]
                progress(f"timing {name}")
                t0 = time.perf_counter()
                times, more = self.time_candidate(runner, w)
                self.phases["timing"] += time.perf_counter() - t0
                notes += more
                mean = statistics.fmean(times)
                ref_us = ref_timing[name]["mean_us"]
                results[name].update(latency_us=mean, median_us=statistics.median(times),
                                     std_us=statistics.stdev(times), runs=len(times), reference_us=ref_us,
                                     speedup=ref_us / mean)
                if DEVICE == "cuda":
                    results[name]["power_limited"] = self.power_limited.get(name, False)
                if name in base_timing:
                    base_us = base_timing[name]["mean_us"]
                    results[name].update(baseline_us=base_us, speedup_vs_baseline=base_us / mean)
        used = [(source, n) for source, n in self.sources.items() if n]
        result["environment"]["reference_timing"] = "; ".join(
            source if len(used) == 1 and source.startswith("measured") else f"{n} of {len(timed)} workloads {source}"
            for source, n in used) or "no timed workloads"

        rows = [results[w["name"]] for w in timed]
        result["status"] = "passed"
        result["score"] = geomean([r["speedup"] for r in rows])
        result["latency_us"] = geomean([r["latency_us"] for r in rows])
        if base_timing:
            result["speedup_vs_baseline"] = geomean([r["speedup_vs_baseline"] for r in rows])
            result["baseline_score"] = 100 * statistics.fmean(r["speedup_vs_baseline"] for r in rows)
        if result["timing_representative"]:
            notes += [f"{n}: speedup {r['speedup']:.1f}x is implausibly high, worth a second look"
                      for n, r in results.items() if (r.get("speedup") or 0) > 10]
        if "calls_reference" in result.get("flags", []):
            notes.append("the candidate calls the task's reference implementation")
        result["log_excerpt"] = "\n".join(notes)


def geomean(values: list[float]) -> float:
    if not values or any(v <= 0 for v in values):
        return 0.0
    return math.exp(sum(math.log(v) for v in values) / len(values))


def timings_key(task_dir: str, task: dict) -> str:
    """What reference and baseline timings depend on besides the workload: the task's code, the GPU, the versions.
    Timings passed in under another key (the task was edited, another GPU) are measured again."""
    import hashlib

    digest = hashlib.sha256()
    for rel in (task["reference"], task["baseline"]):
        if rel:
            with open(os.path.join(task_dir, rel), "rb") as f:
                digest.update(f.read() + b"\0")
    gpu = str(torch.cuda.get_device_properties(0).uuid) if DEVICE == "cuda" else platform.node()
    digest.update(f"{gpu}:{torch.__version__}:{DEVICE}".encode())
    return digest.hexdigest()[:32]


class Session:
    """The two processes, started before the job is known: the candidate's process (importing torch, then waiting)
    and torch in this one. A parent that starts us ahead of time (``--job-from-stdin``) gets both imports off the
    evaluation's clock."""

    def __init__(self, args):
        global DEVICE, torch
        self.cfg = {"candidate": os.path.abspath(args.candidate), "device": "auto", "cache": args.cache_dir,
                    "judge_pid": os.getpid(), "isolate_network": not args.no_network_isolation,
                    "authkey": _authkey(), "socket_dir": tempfile.mkdtemp(prefix="ksr-", dir="/tmp")}
        private_tmp = os.environ.get("TMPDIR") or "/tmp"
        t0 = time.perf_counter()
        # The candidate's process first: its torch import (seconds) overlaps ours. It picks its device the way we do
        # below, and says which in its "loaded".
        self.runner = RunnerProcess(self.cfg, os.path.join(private_tmp, "candidate.log"), runner_env(private_tmp),
                                    args.memory_limit_gb)
        self.phases = {"spawn": time.perf_counter() - t0}
        t0 = time.perf_counter()
        torch = rl.load_torch()
        if torch.cuda.is_available():
            DEVICE = "cuda"
        else:
            # CPU timings only order candidates, so make them steady: on a busy machine an OpenMP barrier waiting
            # for a descheduled worker thread adds a whole scheduler tick (~8 ms) to a 10 us torch call.
            torch.set_num_threads(1)
        # The judge's timer (the CUDA context, its flush buffer, NVML, the launch cover) and cuBLAS, made here as the
        # runner makes its own before it says "loaded": a process started ahead of its job has them off the
        # evaluation's clock. On an H200 a TriMul evaluation whose judge had them ready took 8.9 s, 10.0-10.1 s
        # otherwise (session 9).
        self.timer = rl.Timer(DEVICE)
        if DEVICE == "cuda":
            warm = torch.ones(64, 64, device=DEVICE)
            (warm @ warm).sum().item()
        self.environment = environment()
        self.phases["imports"] = time.perf_counter() - t0

    def close(self) -> None:
        self.runner.stop()
        if sys.platform.startswith("linux"):
            kill_descendants()
        import shutil

        shutil.rmtree(self.cfg["socket_dir"], ignore_errors=True)


def evaluate(session: Session, args, timings: dict, result: dict, ahead: dict | None = None) -> None:
    """Fill ``result`` in place; raise Failure for a candidate that does not pass. ``timings``: reference/baseline
    timings of an earlier evaluation, to reuse where they fit; ``ahead``: ``time_reference_ahead``'s."""
    if not args.task:
        raise Failure("runtime_error", "the evaluation's job names no task")
    task = read_task(args.task, args.workloads.split(",") if args.workloads else None)
    root = session.cfg["candidate"]
    form = candidate_form(task, root)
    result["environment"] = dict(session.environment)
    result["timing_representative"] = DEVICE == "cuda"
    judge = None
    try:
        if DEVICE != "cuda" and (form == "torch_extension" or task["language"] in ("cuda", "cupy")):
            raise Failure("unavailable", f"this task's candidates are {task['language']} code and this machine has "
                          "no CUDA GPU")
        runner_task = {"reference": os.path.join(os.path.abspath(args.task), task["reference"]),
                       "solution_file": task["solution_file"], "entry_point": task["entry_point"],
                       "kind": task["entry_kind"], "form": form}
        ahead = ahead or {}
        judge = Judge(args, task, result, timings, runner_task, session.timer, ahead.get("timings"))
        judge.phases["reference_timing"] += ahead.get("overrun_s", 0.0)
        judge.phases.update(session.phases)
        judge.run(session.runner)
    except Failure as f:
        if f.status in ("runtime_error", "timeout") and DEVICE == "cuda":
            result["environment"]["gpu_healthy_after"] = gpu_healthy()
        raise
    finally:
        session.close()
        if judge is not None:
            result["phases"] = {k: round(v, 4) for k, v in judge.phases.items()}
            if judge.measured:  # taken before candidate code ran: good for the next evaluation, pass or fail
                result["reference_timings"] = {"key": judge.timings_key, "workloads": judge.measured}


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


def time_reference_ahead(session: Session, args, job: JobWatch) -> dict:
    """A prestarted process given its task (``--time-reference-ahead``) times the reference (and baseline) while it
    waits for the job, holding the GPU's timing lock, before any candidate code exists: a search's first evaluation
    then does not pay for it (3.8 s for TriMul on an H200), while the LLM writes the first candidate. Stops early when
    the job comes; the evaluation times what is left. {} when the task cannot be read or its reference fails: the
    evaluation meets and reports the same problem."""
    t0 = time.perf_counter()
    progress(AHEAD)
    try:
        task = read_task(args.task, args.workloads.split(",") if args.workloads else None)
        judge = Judge(args, task, {}, {}, None, session.timer)
        with timing_lock(args.lock_dir):
            for w in task["workloads"]:
                if w["timed"] and job.at is None:
                    judge.time_reference(w)
    except Exception as e:  # noqa: BLE001 (reported by the evaluation, which runs the same code)
        progress(f"timing the reference ahead failed ({type(e).__name__}); the evaluation will")
        return {}
    done = time.perf_counter()
    progress(f"reference timed ahead: {len(judge.measured)} workloads in {done - t0:.1f} s")
    # A job that came meanwhile waited for the workload in hand: that time is on its clock, as reference timing.
    return {"timings": {"key": judge.timings_key, "workloads": judge.measured}, "task": os.path.abspath(args.task),
            "overrun_s": max(0.0, done - job.at) if job.at is not None else 0.0}


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


def _authkey() -> str:
    import multiprocessing

    return bytes(multiprocessing.current_process().authkey).hex()


def kill_descendants() -> None:
    """SIGKILL every child we have, including the candidate's orphans re-parented to us (see _harden), until none is
    left: the next generation is re-parented to us when its parent dies."""
    me = str(os.getpid())
    for _ in range(50):
        children = []
        for stat in os.listdir("/proc"):
            if not stat.isdigit():
                continue
            try:
                with open(f"/proc/{stat}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == me:
                children.append(int(stat))
        if not children:
            return
        for pid in children:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for pid in children:
            with contextlib.suppress(OSError):
                os.waitpid(pid, 0)


def gpu_healthy() -> bool:
    try:
        x = torch.ones(1 << 20, device="cuda")
        return float(x.sum()) == float(1 << 20)
    except Exception:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
                        help="host memory (resident) the candidate's process may use before it is killed")
    parser.add_argument("--no-network-isolation", action="store_true",
                        help="do not put the candidate in its own network namespace")
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
    faulthandler.enable()
    result_key = os.environ.pop(RESULT_KEY_ENV, "")

    start = time.perf_counter()
    result = {"status": "runtime_error", "workloads": [], "score": 0.0, "latency_us": None, "compile_s": 0.0,
              "wall_s": 0.0, "log_excerpt": "", "timing_representative": False, "environment": {}}
    session = early = None
    try:
        session = Session(args)
    except BaseException as e:  # reported once the job is known
        early = e
    timings, prestarted, ahead, job = {}, False, {}, None
    if args.job_from_stdin:
        import select

        waiting = not select.select([sys.stdin], [], [], 0)[0]
        if waiting:
            if session is not None:  # ready means both processes are: its "loaded" stays unread for run()
                with contextlib.suppress(Failure):
                    session.runner.wait(args.compile_timeout_s)
                if args.time_reference_ahead and args.task:
                    job = JobWatch(args.standby_limit_s)
                    ahead = time_reference_ahead(session, args, job)
            progress("started; waiting for the job")
        try:
            got = read_job(args.standby_limit_s)
        except ValueError as e:
            got, early = {}, early or Failure("runtime_error", f"the evaluation's job was not valid JSON: {e}")
        if got is None:
            if session is not None:
                session.close()
            return 0
        progress("job received")
        args.task, args.workloads, timings = got.get("task"), got.get("workloads") or "", got.get("timings") or {}
        if waiting:  # started ahead of time: the evaluation's clock starts when the job came, imports were off it
            start = job.at if job is not None and job.at is not None else time.perf_counter()
            if session is not None:
                session.phases = {"spawn": 0.0, "imports": 0.0}
            prestarted = True
    try:
        if early is not None:
            raise early
        evaluate(session, args, timings, result,
                 ahead if ahead.get("task") == os.path.abspath(args.task or "") else None)
    except Failure as f:
        result["status"], result["log_excerpt"] = f.status, clip(f.message)
    except BaseException as e:  # a harness or task problem
        result["log_excerpt"] = clip("evaluation failed: " + "".join(traceback.format_exception(e)))
    if result["status"] != "passed":
        result["score"] = 0.0
    if prestarted:
        result["environment"]["prestarted"] = True
    result["wall_s"] = time.perf_counter() - start
    text = json.dumps(result, indent=1)
    if result_key:  # first line: HMAC of the rest, which the parent checks
        import hashlib
        import hmac

        text = hmac.new(result_key.encode(), text.encode(), hashlib.sha256).hexdigest() + "\n" + text
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, args.out)  # the parent never sees a half-written file
    progress(f"done: {result['status']}")
    return 0


if __name__ == "__main__":
    code = main()
    # Skip interpreter teardown (torch and Triton take ~0.5 s to unload).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
