"""The parent's side of the harness: ``SubprocessEvaluator`` runs the judge process (``judge.py``, also reachable as
``tools/evaluate_candidate.py``) in a fresh child process per candidate, in its own process group, killed as a group
on timeout, and turns whatever happens there into an ``EvalResult`` (``ksearch_graph.tasks.evaluation``)."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import math
import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from ksearch_graph.harness import compile_cache
from ksearch_graph.harness.job import AHEAD, RECEIVED, RESULT_KEY_ENV, WAITING, Job, JudgeOptions, progress_line
from ksearch_graph.harness.judge.gpu_share import WAITING_FOR_GPU
from ksearch_graph.harness.judge.sandbox import unavailable_reason
from ksearch_graph.harness.parent.failures import CANNOT_START, JUDGE_LOST, UNREADABLE, infrastructure_error
from ksearch_graph.harness.reporting import PROGRESS
from ksearch_graph.tasks.evaluation import EvalResult, Status
from ksearch_graph.tasks.task import Task

_CHILD = Path(__file__).resolve().parents[1] / "judge" / "judge.py"
_SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD")
_LOG_LIMIT = 2000


def _clip(text: str, limit: int = _LOG_LIMIT) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def write_files(folder: Path, files: dict[str, str]) -> None:
    """Write the candidate's files; a name that would land outside ``folder`` is the candidate's error."""
    for name, text in files.items():
        rel = PurePosixPath(name)
        if not rel.parts or rel.is_absolute() or ".." in rel.parts or "\\" in name:
            raise ValueError(f"file name {name!r} is not a relative path inside the candidate folder")
        path = folder.joinpath(*rel.parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _wait_unreaped(pid: int, timeout_s: float) -> bool:
    """Wait for the child to exit without reaping it: while it is an unreaped zombie its process-group id cannot be
    reused, so killing the group afterwards cannot hit an unrelated process. True if it exited in time."""
    deadline = time.monotonic() + timeout_s
    while True:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class SandboxUnavailable(RuntimeError):
    """No sandbox can be made on this host (harness/judge/sandbox.py says why and how to install one)."""


def gpu_driver_present() -> bool:
    # NVIDIA and AMD runtimes reserve tens of GB of virtual address space at initialisation.
    return any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/kfd"))


class SubprocessEvaluator:
    """Evaluates each candidate in a fresh child process and turns whatever happens there into an EvalResult.

    The child runs in a private temp dir, in its own session and process group, with a scrubbed environment, its
    own Triton/torch caches and a hidden seed for the input sets. A hang is killed with its whole group at
    ``timeout_s`` (wall clock, import and compile included); a crash becomes a runtime_error with the signal and the
    end of stderr. ``evaluate`` does not raise for anything the candidate does.
    """

    def __init__(
        self,
        *,
        timeout_s: float = 120,
        python: str = sys.executable,
        workdir: str | None = None,
        workloads: Literal["feedback", "all"] = "feedback",
        time_budget_s: float = 1.0,
        memory_limit_gb: float = 16.0,
        compile_timeout_s: float | None = None,
        call_timeout_s: float | None = None,
        cache_dir: str | None = None,
        isolate_network: bool = True,
        reuse_reference_timings_s: float = 1800.0,
        prestart: bool | None = None,
        env: dict[str, str] | None = None,
        sandbox: str = "bwrap",
    ):
        if workloads not in ("feedback", "all"):
            raise ValueError(f"workloads must be 'feedback' or 'all', not {workloads!r}")
        self.timeout_s = timeout_s
        self.python = python
        self.workdir = workdir
        if workdir:
            os.makedirs(workdir, exist_ok=True)
        self.workloads = workloads
        self.time_budget_s = time_budget_s  # timing budget per workload, for candidate and reference each
        # Host memory: an address-space limit on the whole evaluation where no GPU driver is present (the driver maps
        # far more than it uses), and everywhere the judge's watch on the candidate process's resident memory.
        self.memory_limit_gb = memory_limit_gb
        # Separate limits for the candidate's compile (import, extension build, first call) and for any other call;
        # timeout_s stays the wall-clock limit of the whole evaluation.
        self.compile_timeout_s = compile_timeout_s or timeout_s
        self.call_timeout_s = call_timeout_s or min(60.0, timeout_s)
        # Compiled kernels (Triton, CuPy/NVRTC, torch extensions) are cached by source hash across evaluations.
        self.cache_dir = cache_dir or os.environ.get("KSEARCH_CACHE_DIR") or str(
            Path.home() / ".cache" / "ksearch_graph")
        self.isolate_network = isolate_network
        # The candidate's process runs in bubblewrap (harness/judge/sandbox.py); "none" only where the host has none, and
        # every result says so. Refused here, before anything is spent, where it cannot be made.
        if sandbox not in ("bwrap", "none"):
            raise ValueError(f"sandbox must be 'bwrap' or 'none', not {sandbox!r}")
        if sandbox == "bwrap" and unavailable_reason():
            raise SandboxUnavailable(unavailable_reason())
        self.sandbox = sandbox
        # Set in the judge's environment over ours, e.g. CUDA_VISIBLE_DEVICES from an evaluation pool's slot.
        self.env = dict(env or {})
        # The reference (and baseline) is timed once per session and GPU, then reused for this long: every candidate
        # of a search is compared with the same reference figure, and an evaluation saves its timing (docs/timing.md,
        # "Other costs measured"). 0 times it in every evaluation. Kept here, in the trusted parent, never in a file a
        # candidate could write; the child reuses an entry only for the same task code, workload, GPU and torch.
        self.reuse_reference_timings_s = reuse_reference_timings_s
        self._timings: dict[tuple, dict] = {}  # (task root, visible GPUs) -> {"key", "workloads": {name: entry}}
        self._timings_lock = threading.Lock()  # its own: share_reference_timings lends both to other evaluators
        self._lock = threading.Lock()  # the standby: the graph may evaluate from several threads
        # Start the next evaluation's two processes as soon as one starts (and on start_ahead()), so their imports
        # (torch, CUDA: seconds on a GPU host) happen while an evaluation runs or the search waits for its LLM, not
        # while it waits for a result. Each evaluation still gets fresh processes. Default: on GPU hosts (on a small
        # CPU machine they would compete for cores).
        self.prestart = gpu_driver_present() if prestart is None else prestart
        self._standby: list[_Started] = []  # at most one, handed to the next evaluate()
        self._ahead_task: Task | None = None  # start_ahead()'s: its reference is timed while a standby waits
        self._generation = 0  # close() moves it on: an evaluate() begun before then starts no new standby
        self._finalizer = weakref.finalize(self, _discard_all, self._standby)

    def start_ahead(self, task: Task | None = None) -> None:
        """With ``prestart``: start the next evaluation's processes now. A search calls this as it starts, so its
        first evaluation finds their imports done (the LLM's first turns cover them). Not done on construction:
        every evaluator a program makes would then keep an idle pair on the GPU.

        With the ``task`` the search will evaluate, a standby started while this evaluator holds no reusable
        reference timings for it times the task's reference while it waits (the first evaluation, and the first
        after they expire), as the evaluation would have, still before any candidate code exists."""
        if task is not None:
            self._ahead_task = task
        if self.prestart:
            self._refill(self._generation)

    def evaluate(self, task: Task, files: dict[str, str], *, attempt_id: str) -> EvalResult:
        start = time.monotonic()
        with self._lock:
            started = self._standby.pop() if self._standby else None
            generation = self._generation
        if self.prestart:  # the next pair imports while this evaluation runs (a search with no LLM wait needs it)
            self._refill(generation, time_ahead=False)
        if started is not None and started.proc.poll() is not None:  # it gave up waiting, or died
            started.discard()
            started = None
        try:
            for _attempt in range(2):
                fresh = started is None
                try:
                    started = started or self._start()
                except OSError as e:
                    return EvalResult(status=Status.unavailable, log_excerpt=f"{CANNOT_START}{self.python}: {e}")
                result = self._run(task, files, started)
                started.discard()
                if fresh or not started.died_waiting:
                    break
                started = None  # a prestarted pair died before it took the job (no candidate code ran): once more
        finally:
            if started is not None:
                started.discard()
            if self.prestart:
                self._refill(generation)
        result.wall_s = time.monotonic() - start  # what the search pays, process start-up included
        result.log_excerpt = _clip(result.log_excerpt)
        return result

    def close(self) -> None:
        """Stop the prestarted processes, if any (also done when the evaluator is garbage-collected, or at exit)."""
        with self._lock:
            self._generation += 1
            _discard_all(self._standby)

    def wait_until_prestarted(self, timeout_s: float = 60.0) -> bool:
        """Wait until the next evaluation's processes have finished their imports (True), as they will have in a
        search by the time the LLM has written the next candidate. False when there are none, or on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                started = self._standby[0] if self._standby else None
            if started is None or started.proc.poll() is not None:
                return False
            with contextlib.suppress(OSError):
                if WAITING in (started.root / "stderr.txt").read_text(errors="replace"):
                    return True
            time.sleep(0.1)
        return False

    def _refill(self, generation: int, time_ahead: bool = True) -> None:
        """A standby pair, unless one waits already. ``time_ahead``: it may time the task's reference while it waits
        (not while an evaluation that is about to time it runs)."""
        with self._lock:
            if self._standby or generation != self._generation:
                return
        try:
            fresh = self._start(time_ahead)
        except OSError:
            return
        with self._lock:
            if self._standby or generation != self._generation:  # another thread was quicker, or close() came
                fresh.discard()
            else:
                self._standby.append(fresh)

    def _start(self, time_ahead: bool = False) -> _Started:
        """Start an evaluation's processes: they import torch, then wait for the job on stdin (``time_ahead``: timing
        the reference of start_ahead()'s task meanwhile, where no reusable timing of it is held)."""
        root = Path(tempfile.mkdtemp(prefix="ksearch-eval-", dir=self.workdir))
        candidate, cache = root / "candidate", root / "cache"
        candidate.mkdir()
        cache.mkdir()
        compile_cache.seed_harness(self.cache_dir, str(cache))
        options = JudgeOptions(
            candidate=str(candidate), out=str(root / "result.json"), job_from_stdin=True, sandbox=self.sandbox,
            eval_cache=str(cache), seeds_from_env=True, time_budget_s=self.time_budget_s,
            compile_timeout_s=self.compile_timeout_s, call_timeout_s=self.call_timeout_s, cache_dir=self.cache_dir,
            lock_dir=str(Path(tempfile.gettempdir())), memory_limit_gb=self.memory_limit_gb,
            no_network_isolation=not self.isolate_network)
        ahead = self._ahead_task if self.prestart and time_ahead else None  # else the job comes at once: no wait
        if ahead is not None and not self._reusable_timings(self._timings_slot(ahead)):
            options.task, options.workloads, options.time_reference_ahead = ahead.root, self._job_workloads(ahead), True
        cmd = [self.python, str(_CHILD), *options.command_line()]
        key = secrets.token_hex(32)
        try:
            with open(root / "stdout.txt", "wb") as stdout, open(root / "stderr.txt", "wb") as stderr:
                proc = subprocess.Popen(cmd, cwd=candidate, env=self._child_env(root) | {RESULT_KEY_ENV: key},
                                        stdin=subprocess.PIPE, stdout=stdout, stderr=stderr, start_new_session=True)
        except OSError:
            shutil.rmtree(root, ignore_errors=True)
            raise
        self._limit(proc.pid)
        return _Started(root, proc, key)

    def _run(self, task: Task, files: dict[str, str], started: _Started) -> EvalResult:
        root, proc, key = started.root, started.proc, started.key
        candidate, out = root / "candidate", root / "result.json"
        try:
            write_files(candidate, files)
        except ValueError as e:
            return EvalResult(status=Status.compile_error, log_excerpt=str(e))
        timings_slot = self._timings_slot(task)
        job = Job(task.root, self._job_workloads(task), self._reusable_timings(timings_slot) or {})
        data, refused = job.to_json(), []

        def send() -> None:  # from a thread: a child that does not read must not stall us past the timeout
            try:
                proc.stdin.write(data)
                proc.stdin.close()
            except OSError:  # the child was gone before it could take its job
                refused.append(True)

        writer = threading.Thread(target=send, daemon=True)
        writer.start()
        sent = time.monotonic()
        try:
            finished = _wait_unreaped(proc.pid, self.timeout_s)
        finally:
            _kill_group(proc.pid)  # on timeout, and also any helper a finished candidate left running
            proc.wait()
        writer.join(timeout=5)
        stderr_text = (root / "stderr.txt").read_text(errors="replace").replace(f"{candidate}{os.sep}", "")
        # Gone before it took the job (its pipe refused it, or it never said it had it): no candidate code ran, so
        # the evaluation may be tried again with fresh processes.
        started.died_waiting = not out.is_file() and (bool(refused) or (
            progress_line(RECEIVED) not in stderr_text and (_last_step(stderr_text) == WAITING
                                                         or progress_line(AHEAD) in stderr_text)))
        if not finished and _last_step(stderr_text) == WAITING_FOR_GPU:  # other evaluations held the GPU
            return infrastructure_error(f"timed out after {self.timeout_s:g} s waiting for the GPU, which other "
                                        "evaluations were timing on", "raise --eval-timeout, or lower --lanes-per-gpu")
        if not finished:
            return EvalResult(
                status=Status.timeout,
                log_excerpt=f"timed out after {self.timeout_s:g} s (wall clock); it was at: {_last_step(stderr_text)}",
            )
        if out.is_file():
            signature, _, text = out.read_text().partition("\n")
            if not hmac.compare_digest(signature, hmac.new(key.encode(), text.encode(), hashlib.sha256).hexdigest()):
                return EvalResult(status=Status.suspicious, log_excerpt="the result file was not the one the "
                                  "evaluation wrote (forged or overwritten by the candidate)")
            try:
                result = EvalResult.model_validate_json(text)
                # Python start-up and imports the child's own clock did not see (none when it was prestarted).
                result.phases["startup"] = round(max(0.0, time.monotonic() - sent - result.wall_s), 4)
                self._keep_timings(timings_slot, result.reference_timings)
                return result
            except ValueError as e:
                return EvalResult(status=Status.runtime_error, log_excerpt=f"{UNREADABLE}: {e}")
        if proc.returncode < 0:
            sig = signal.Signals(-proc.returncode)
            how = f"killed by {sig.name} ({signal.strsignal(sig)})"
        else:
            how = f"exited with code {proc.returncode} without writing a result"
        return EvalResult(
            status=Status.runtime_error,
            log_excerpt=f"{JUDGE_LOST}{how}; it was at: {_last_step(stderr_text)}\n"
            + _stderr_tail(stderr_text),
        )

    def _job_workloads(self, task: Task) -> str:
        return ",".join(w.name for w in task.feedback_workloads()) if self.workloads == "feedback" else ""

    def _timings_slot(self, task: Task) -> tuple:
        return task.root, self.env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))

    def share_reference_timings(self, other: SubprocessEvaluator) -> None:
        """Reuse ``other``'s reference timings, and give it ours: evaluators of one GPU (a pool's lanes) then time
        the reference once between them, not once each."""
        self._timings, self._timings_lock = other._timings, other._timings_lock

    def _reusable_timings(self, slot: tuple) -> dict:
        with self._timings_lock:
            kept = self._timings.get(slot)
            if not kept or self.reuse_reference_timings_s <= 0:
                return {}
            now = time.monotonic()
            fresh = {name: entry for name, (at, entry) in kept["workloads"].items()
                     if now - at < self.reuse_reference_timings_s}
            return {"key": kept["key"], "workloads": fresh} if fresh else {}

    def _keep_timings(self, slot: tuple, measured: dict) -> None:
        if not measured or self.reuse_reference_timings_s <= 0:
            return
        with self._timings_lock:
            kept = self._timings.get(slot)
            if kept is None or kept["key"] != measured["key"]:  # the task's code or the GPU changed: start over
                kept = self._timings[slot] = {"key": measured["key"], "workloads": {}}
            now, wall = time.monotonic(), time.time()
            # Kept from when it was measured (a prestarted process may have waited long for its job), not from now.
            kept["workloads"].update({name: (now - _age_s(entry, wall), entry)
                                      for name, entry in measured["workloads"].items()})

    def _child_env(self, root: Path) -> dict[str, str]:
        env = {k: v for k, v in (os.environ | self.env).items() if not any(w in k.upper() for w in _SECRET_WORDS)}
        for var, sub in (("TMPDIR", "tmp"), ("TORCHINDUCTOR_CACHE_DIR", "inductor-cache")):
            (root / sub).mkdir()
            env[var] = str(root / sub)
        # The judge's own compile caches (the launch cover, a Triton reference), which no candidate writes; each
        # candidate's are its own evaluation's (harness/compile_cache.py).
        for var, sub in (("TRITON_CACHE_DIR", "triton"), ("CUPY_CACHE_DIR", "cupy"),
                         ("TORCH_EXTENSIONS_DIR", "torch-extensions")):
            env[var] = os.path.join(self.cache_dir, compile_cache.HARNESS, sub)
            os.makedirs(env[var], exist_ok=True)
        env["KSEARCH_EVAL_SEED"] = str(secrets.randbits(62))  # fresh input sets for every evaluation
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["KSEARCH_PARENT_PID"] = str(os.getpid())  # the child dies with us (a killed search leaves no orphan)
        if env.get("KSEARCH_TIMING_TRACE"):  # the judge runs in the candidate's folder: a relative path would land there
            env["KSEARCH_TIMING_TRACE"] = os.path.abspath(env["KSEARCH_TIMING_TRACE"])
        return env

    def _limit(self, pid: int) -> None:
        """Resource limits, set on the running child with prlimit rather than in a preexec_fn, which is unsafe when
        the caller has threads (LangGraph runs parallel nodes in worker threads). The child spends its first seconds
        importing torch, long before any candidate code runs, and everything it spawns inherits the limits."""
        if not hasattr(resource, "prlimit"):  # not Linux: the wall-clock timeout still applies
            return
        try:
            # No RLIMIT_CPU: while one is set the kernel reads a process's CPU clock from a sum it updates only at
            # scheduler ticks (4 ms here), which would make CPU call times, the judge's reference and the
            # candidate's, too coarse to bound. Processes that leave the process group are the sandbox's to end.
            resource.prlimit(pid, resource.RLIMIT_CORE, (0, 0))  # a segfault should not write gigabytes of core
            # An address-space limit breaks CUDA (the driver maps far more virtual memory than it uses), so it only
            # applies where no GPU driver is present; on a GPU host the GPU's own memory is the bound anyway.
            if not gpu_driver_present():
                limit = int(self.memory_limit_gb * 2**30)
                resource.prlimit(pid, resource.RLIMIT_AS, (limit, limit))
        except (ProcessLookupError, PermissionError):
            pass  # the child already exited, or the platform refuses: the result says what happened


class _Started:
    """An evaluation's judge process (with the candidate's process it started), waiting for its job on stdin."""

    def __init__(self, root: Path, proc: subprocess.Popen, key: str):
        self.root, self.proc, self.key = root, proc, key
        self.died_waiting = False  # gone before it could take its job

    def discard(self) -> None:
        if self.proc.poll() is None:  # not reaped yet, so its process-group id is still its own
            _kill_group(self.proc.pid)
            self.proc.wait()
        if self.proc.stdin and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        shutil.rmtree(self.root, ignore_errors=True)


def _discard_all(standby: list) -> None:
    while standby:
        standby.pop().discard()


def _age_s(entry: Any, wall: float) -> float:
    """Seconds since the evaluation child measured this reference timing (its ``at``, wall clock); 0 if unknown."""
    at = entry.get("at") if isinstance(entry, dict) else None
    return max(0.0, wall - at) if isinstance(at, (int, float)) and math.isfinite(at) else 0.0


def _last_step(stderr_text: str) -> str:
    steps = [line[len(PROGRESS):] for line in stderr_text.splitlines() if line.startswith(PROGRESS)]
    return steps[-1] if steps else "start-up (importing torch)"


def _stderr_tail(stderr_text: str, limit: int = 1500) -> str:
    # Drop what does not help the LLM: progress lines, faulthandler's list of loaded extension modules, and stack
    # frames of the harness itself.
    lines = [line for line in stderr_text.splitlines()
             if not line.startswith((PROGRESS, "Extension modules:")) and str(_CHILD.parents[1]) not in line]
    return "\n".join(lines)[-limit:]
