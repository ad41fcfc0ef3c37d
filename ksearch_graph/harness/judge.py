"""Evaluate one kernel candidate and write an EvalResult-shaped JSON: the judge process of SubprocessEvaluator.

    python ksearch_graph/harness/judge.py --task TASK_DIR --candidate CANDIDATE_DIR --out RESULT.json
        [--workloads NAME,NAME] [--seeds-from-env] [--time-budget-s S] [--compile-timeout-s S]
        [--call-timeout-s S] [--cache-dir DIR] [--lock-dir DIR] [--no-network-isolation]
    python ksearch_graph/harness/judge.py --job-from-stdin --candidate CANDIDATE_DIR --out RESULT.json [...]

Started by path and importing only the standard library, torch and this package (never the rest of ksearch_graph):
this folder is what a GPU host needs. ``tools/evaluate_candidate.py`` runs it from a checkout.

Two processes, and why. This process (the judge) never imports candidate code. It starts the candidate's process
(``runner.py``: own network namespace, no seed, no secrets) and drives it over a socket. For every input
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
3. Timing of the timed workloads, holding the GPU's timing lock, in bursts (``timing.timed_burst``): every timed call
   on an input set generated just before it, under sustained load (a heat of the same calls before, untimed calls
   between for power-limited workloads: policy.py, fill_duty), behind a launch cover that flushes the L2 (cover_s),
   events plus a device-wide synchronize, its output copied and fingerprinted at once. After each burst the judge
   picks which calls to re-check against the reference (the first and last timed call, and a random fifth of the
   others): the candidate cannot tell which.
"""

from __future__ import annotations

import contextlib
import faulthandler
import math
import os
import random
import secrets
import statistics
import sys
import time
import traceback

if __name__ == "__main__" and not __package__:  # started by path: import the package, not this folder's files
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    __package__ = "ksearch_graph.harness"  # noqa: A001

from . import time_bound  # noqa: E402
from ._torch import load_torch  # noqa: E402  (no module here imports torch before load_torch)
from .compare import compare, same  # noqa: E402
from .gpu import gpu_healthy  # noqa: E402
from .guards import InterpreterHooks  # noqa: E402
from .isolation import die_with_parent, harden  # noqa: E402
from .policy import POLICY  # noqa: E402
from .protocol import (Armed, Burst, Call, Drop, Flags, Import, Loaded, Next, Output, Ready, Seed,  # noqa: E402
                       Send, Timed, Warm, Warmed)
from .reply_checks import check_burst_timings, check_flags  # noqa: E402
from .reporting import Failure, TimingTrace, clip, describe, progress  # noqa: E402
from .results import new_result, summarise, write_signed  # noqa: E402
from .runner_process import RunnerProcess  # noqa: E402
from .session import SEED_ENV, TRACE_ENV, JobWatch, Session, read_arguments, read_job, timing_lock  # noqa: E402
from .tasks import candidate_form, derive_seed, load_module, prepare, read_task, timings_key  # noqa: E402
from .tensors import as_tensors, clone, fingerprint, nbytes  # noqa: E402
from .timer import Timer  # noqa: E402
from .timing import (Bursts, SideStreamRule, burst_memory_bytes, burst_size, honest_times,  # noqa: E402
                     precise_enough, timed_burst)

AHEAD = "timing the reference while waiting for the job"  # client.py's _AHEAD: no candidate code has run yet
RESULT_KEY_ENV = "KSEARCH_RESULT_KEY"  # signs the result file, so a forged or overwritten one is recognised


class Judge:
    """``cached``: reference timings of an earlier evaluation ({"key", "workloads"}); ``ahead``: those this process
    measured while it waited for the job (``time_reference_ahead``); ``timer``: the session's. A judge with no
    ``runner_task`` only times the reference: its base seed is its own, the hidden one stays for the evaluation's."""

    def __init__(self, args, task: dict, result: dict, cached: dict, runner_task: dict | None, timer: Timer,
                 ahead: dict | None = None):
        self.args, self.task, self.result = args, task, result
        self.runner_task = runner_task  # what the candidate's process needs to import the candidate
        self.tol = task["tolerance"]
        hidden = args.seeds_from_env and runner_task is not None
        self.base_seed = int(os.environ.pop(SEED_ENV)) if hidden else secrets.randbits(62)
        self.rng = random.Random(secrets.randbits(64))  # which timed calls get re-checked
        self.timer = timer  # the Session's: made before this process's CUDA context (see gpu.CudaRuntime)
        self.timing_trace = TimingTrace(os.environ.get(TRACE_ENV))
        self.timer.heated = False  # the first heat here may start from a GPU that cooled while this process waited
        self.timer.use_timing(task["timing"])
        self.added_keys: list[str] = []  # keys the candidate added to its input dicts (a cache): flagged, not failed
        self.host_timed: list[str] = []  # workloads whose every timed call read 0 us of device time
        self.device = "cuda" if timer.cuda else "cpu"  # the session's, which made the timer
        self.min_runs = POLICY.min_runs_gpu if self.device == "cuda" else POLICY.min_runs
        self.ref = load_module("ksearch_reference", os.path.join(args.task, task["reference"]))
        self.baseline = None
        if task["baseline"]:
            base = load_module("ksearch_baseline", os.path.join(args.task, task["baseline"]))
            self.baseline = getattr(base, task["entry_point"])
        # The reference's timed calls take the same steps as the candidate's, its interpreter-hook check included (on
        # CPU no device clock leaves that host time out; docs/timing.md, "Other costs measured"). On a GPU it runs under
        # the launch cover. Made after the task's modules are imported: the check puts back what it saw then (gc
        # callbacks, trace and profile functions) after every call.
        self.timer.hooks = InterpreterHooks()
        self.phases = {"waiting_for_runner": 0.0, "reference_timing": 0.0, "waiting_for_compile": 0.0,
                       "reference": 0.0, "correctness": 0.0, "timing": 0.0, "checks": 0.0,
                       # parts of "timing": the candidate's heats and its fillers between timed calls (timer.Timer)
                       "timing_heat": 0.0, "timing_fill": 0.0}
        self.timings_key = timings_key(args.task, task, self.device)
        self.cached, self.ahead = ((kept or {}).get("workloads", {}) if isinstance(kept, dict) and kept.get(
            "key") == self.timings_key else {} for kept in (cached, ahead))
        self.measured = {}  # reference/baseline timings measured by this process, for the parent to reuse
        self.ref_timing, self.base_timing = {}, {}
        self.sources = {"measured in this evaluation": 0, "measured while its processes waited for the job": 0,
                        "reused from an earlier evaluation on this GPU": 0}
        self.call_bytes = {}  # per workload: one input set and its output, for the size of timing bursts
        self.power_limited = {}  # per workload: the candidate's heat found the GPU at its power limit
        # time_bound.py: what the candidate's side adds to a timed call, measured here (run)
        self.round_trip_us, self.guard_us, self.fingerprint_us = (0.0, 0.0), 0.0, {}

    def inputs(self, w: dict, seed: int):
        return self.ref.make_inputs(w["params"], seed, self.device)

    def correctness_seed(self, workload: str, i: int) -> int:
        """With input_source "gpumode" the first input set of a workload is seed 0, which the task's make_inputs reads
        as the problem's own public seed (upstream's test and benchmark inputs); every other input set, and every
        timed call, gets a hidden seed."""
        if i == 0 and self.task["input_source"] == "gpumode":
            return 0
        return derive_seed(self.base_seed, workload, i)

    def reference(self, inputs):
        torch = load_torch()
        fn, args = prepare(self.ref.reference, clone(inputs), self.task["entry_kind"], self.device)
        with torch.no_grad():
            return as_tensors(fn(*args))

    # -- timing on this side (reference, baseline) and on the runner's (candidate), the same way -------------------

    def burst_size(self, done: int, call_bytes: int, call_s: float, limited: bool = False) -> int:
        """``timing.burst_size`` within this evaluation's budget and burst memory."""
        return burst_size(done, call_bytes, call_s, limited, self.min_runs, self.args.time_budget_s,
                          burst_memory_bytes(self.device))

    def time_local(self, fn, w: dict, tag: str) -> dict:
        """Reference or baseline timing: the candidate's procedure, run here on this side's functions; also the
        host time of each call's steps besides the call (time_bound.py's calibration)."""
        torch = load_torch()
        times, hosts, overheads = [], [], []
        call = lambda k: prepare(fn, self.inputs(w, derive_seed(self.base_seed, w["name"], tag, k)),  # noqa
                                 self.task["entry_kind"], self.device)
        warm = self.inputs(w, derive_seed(self.base_seed, w["name"], tag, -1))
        f, a = prepare(fn, warm, self.task["entry_kind"], self.device)
        with torch.no_grad():
            t0 = time.perf_counter()
            out = f(*a)  # warm-up: compile, autotune and caches stay outside the timed region
            self.timer.sync()
            call_s = time.perf_counter() - t0
            call_bytes = nbytes(warm) + nbytes(out)
            del out, warm
            started, bursts = time.perf_counter(), Bursts()
            while not precise_enough(honest_times(times, hosts)[0], started, self.args.time_budget_s,
                                     time.perf_counter(), self.min_runs, self.timer.power_limited, *bursts.rule()):
                first, burst_started, heated = len(times), time.perf_counter(), self.timer.spent_s["heat"]
                self.timer.untimed_us = []  # only the candidate's are checked; here they would just pile up
                self.timer.heat(f, a, first == 0)
                stamps, fills = [], []  # time_bound.py: this side's clock around each call, and its fillers

                def next_call(k):
                    stamps.append(time.perf_counter())
                    fills.append(self.timer.spent_s["fill"])
                    return call(first + k)  # noqa: B023 (called before the next iteration)

                done = timed_burst(self.timer, self.burst_size(first, call_bytes, call_s, self.timer.power_limited),
                                   next_call, filler=(f, a))
                stamps.append(time.perf_counter())
                fills.append(self.timer.spent_s["fill"])
                times += [us for _, us, *_ in done]
                hosts += [host for *_, host in done]
                overheads += time_bound.reference_overheads(stamps, [us for _, us, *_ in done], fills)
                bursts.add(first, len(done), burst_started, self.timer.spent_s["heat"] - heated,
                           self.timer.power_limited)
                self.timing_trace.write(tag, w["name"], first, [call_times for _, *call_times in done])
                del done
        times, on_host = honest_times(times, hosts)
        return {"mean_us": statistics.fmean(times), "runs": len(times), "overheads_us": overheads} | (
            {"host_clock": True} if on_host else {})

    def time_candidate(self, runner: RunnerProcess, w: dict) -> tuple[list[float], list[str]]:
        name, params, notes = w["name"], w["params"], []
        where = f"workload {name}, timed call"
        call_s = runner.request(Warm(name, params, derive_seed(self.base_seed, name, "warm"), False),
                                self.args.call_timeout_s, f"{where} (warm-up)", expect=Warmed).seconds
        # The candidate's process says how long its warm-up call took; it only sizes bursts and their time limit.
        call_s = min(max(call_s, 0.0), self.args.call_timeout_s) if isinstance(call_s, float) and math.isfinite(
            call_s) else self.args.call_timeout_s
        times, tails, hosts, started, side = [], [], [], time.perf_counter(), SideStreamRule()
        made = 0  # calls made, a dropped burst's included: every call gets inputs of its own
        clock = time_bound.ContradictionRule()  # bursts the judge's clock contradicts
        bursts = Bursts()
        while True:
            first, burst_started, heated = made, time.perf_counter(), self.phases["timing_heat"]
            seeds = [derive_seed(self.base_seed, name, "time", first + k)
                     for k in range(self.burst_size(len(times), self.call_bytes[name], call_s,
                                                    self.power_limited.get(name, False)))]
            made += len(seeds)
            # A later burst's heat: POLICY.heat_min_s (or POLICY.heat_s), plus the calls still in flight when it ends.
            heat_s = (POLICY.heat_min_s if first else POLICY.heat_max_s) + 2 * call_s
            deadline = time.monotonic() + self.args.call_timeout_s + (
                len(seeds) * (1 + POLICY.fill_max) + 2) * 4 * call_s + heat_s
            reply = runner.request(Burst(name, params, len(seeds), derive_seed(self.base_seed, name, "heat", first),
                                         first == 0), deadline - time.monotonic(), where, expect=(Next, Timed))
            pid = runner.proc.pid if self.device != "cuda" else None  # time_bound.py: its waits to run, on CPU
            served, stamps = 0, [time_bound.stamp(pid)]  # time_bound.py: when each call began, seen from here
            while isinstance(reply, Next):  # each call's seed only once the previous call is done (Runner.burst)
                if type(reply.index) is not int or reply.index != served or served >= len(seeds):
                    raise Failure("suspicious", f"{where}: the candidate's process asked for input set "
                                  f"{str(reply.index)[:40]!r} out of turn (next: {served})")
                reply = runner.request(Seed(seeds[served]), max(0.0, deadline - time.monotonic()), where,
                                       expect=(Next, Timed))
                stamps.append(time_bound.stamp(pid))
                served += 1
            if served != len(seeds):
                raise Failure("suspicious", f"{where}: the candidate's process answered {type(reply).__name__} after "
                              f"{served} of {len(seeds)} input sets, not its timings")
            timed, prints, flags, untimed = reply
            check_flags(flags, where)
            self.power_limited[name] = flags.power_limited is True
            for part in ("heat", "fill"):  # the process's totals so far: informative only, so just kept sane
                spent = getattr(flags, f"{part}_s")
                if isinstance(spent, float) and 0 <= spent < 1e6:
                    self.phases[f"timing_{part}"] = spent
            check_burst_timings(timed, prints, untimed, len(seeds), where)
            device = [us for us, _, _, _ in timed]
            # time_bound.py; a burst that read 0 us throughout is judged on its host times, as it is reported
            spans, cal, limited = time_bound.call_spans_us(stamps), self.calibration(name), self.power_limited[name]
            reported = honest_times(device, [h for *_, h in timed])[0]
            verdict, why = clock.judge(spans, reported, cal, limited, f"{first + 1}-{made}")
            bound = time_bound.trace_figures(spans, cal, limited)
            if verdict == "fail":
                self.timing_trace.write("candidate", name, first, timed, dropped=True, bound=bound)
                raise Failure("suspicious", f"{where}s {first + 1}-{made}: {why}: its timer was tampered with")
            if verdict == "keep":
                verdict = side.verdict(device, [tail - probe for _, tail, probe, _ in timed])
            self.timing_trace.write("candidate", name, first, timed, dropped=verdict == "drop", bound=bound)
            if verdict == "drop":
                notes.append(f"{name}: {why}" if why else f"{name}: calls {first + 1}-{made} left {side.extra_us:.0f} "
                             "us of device work past their end event on average (work on another stream?); dropped "
                             "and timed again")
            else:
                times += device
                tails += [tail for _, tail, _, _ in timed]
                hosts += [host for _, _, _, host in timed]
            # The process's own heat figure (a total so far), bounded by this burst's time here and by the longest
            # heat there is: it only decides whether three bursts fit, so a process that overstates it gets at most
            # heat_max_s of room for them (another burst or two, within the call limits), and one that understates
            # it a single burst, which telling the judge it is not power-limited would give it anyway.
            heat_s = min(max(0.0, self.phases["timing_heat"] - heated), time.perf_counter() - burst_started,
                         POLICY.heat_max_s + 2 * call_s)
            bursts.add(first, 0 if verdict == "drop" else len(device), burst_started, heat_s, self.power_limited[name])
            last = verdict != "drop" and precise_enough(honest_times(side.reported(times, tails), hosts)[0], started,
                                                        self.args.time_budget_s, time.perf_counter(),
                                                        self.min_runs, self.power_limited[name], *bursts.rule())
            # Which outputs get re-checked is chosen now, after the burst: the candidate cannot tell which.
            chosen = [i for i in range(len(seeds)) if (first == 0 and i == 0) or (last and i == len(seeds) - 1)
                      or self.rng.random() < POLICY.check_probability]
            for i in chosen:
                sent = runner.request(Send(i), self.args.call_timeout_s, where, expect=Output)
                out, got_inputs = sent.out, sent.inputs
                self.note_added_keys(sent.flags)
                if fingerprint(out) != prints[i]:
                    raise Failure("suspicious", f"{where} {first + i + 1}: its output changed after the call "
                                  "had returned it (written by something still running?)")
                t1 = time.perf_counter()
                pristine = self.inputs(w, seeds[i])
                expected = self.reference(pristine)
                self.phases["reference"] += time.perf_counter() - t1
                self.check(out, got_inputs, pristine, expected,
                           f"{where} {first + i + 1} (passed the correctness check)")
                del out, got_inputs, sent, pristine, expected
            runner.send(Drop())
            if last:
                break
        if side.charged:
            notes.append(f"{name}: the device stayed busy {side.extra_us:.0f} us after the call ended on its stream "
                         f"in a burst timed after {side.dropped} dropped for it (work on another stream?); every call "
                         "timed until the whole device was idle")
        times, on_host = honest_times(side.reported(times, tails), hosts)
        if on_host:
            self.host_timed.append(name)
            notes.append(f"{name}: every timed call read 0 us of device time (no work between its events: a view "
                         "returned, or the work done on the host); timed by the host clock around each call instead")
        return times, notes

    def calibration(self, name: str) -> time_bound.Calibration | None:
        """time_bound.py's calibration for a workload: the reference's per-call overheads, plus what only the
        candidate's side does (round trip, fingerprint, integrity check); None where the reference timing kept none
        (reused from a harness without them)."""
        (trip, trip_spread), extra = self.round_trip_us, self.fingerprint_us.get(name, 0.0) + self.guard_us
        return time_bound.calibrate(self.ref_timing[name].get("overheads_us", []), trip + extra, trip_spread,
                                    cpu=self.device != "cuda")

    # -- checks ----------------------------------------------------------------------------------------------------

    def check(self, out, got_inputs, pristine, expected, where: str, row: dict | None = None) -> tuple[float, float]:
        """Inputs unchanged and output right; the errors go into ``row`` (the workload's result) either way."""
        t0 = time.perf_counter()
        unchanged = same(pristine, got_inputs)
        if unchanged:
            status, message, max_err, max_rel = compare(out, expected, self.tol, self.task["compare_dtype"])
        self.phases["checks"] += time.perf_counter() - t0
        if not unchanged:
            raise Failure("suspicious", f"{where}: the candidate wrote into its input tensors")
        if row is not None and (status or max_err > (row.get("max_abs_error") or 0.0)):
            finite = lambda v: v if math.isfinite(v) else None  # noqa: E731  (JSON has no infinity)
            row.update(max_abs_error=finite(max_err), max_rel_error=finite(max_rel))
        if status:
            raise Failure(status, f"{where}: {message}")
        return max_err, max_rel

    def note_added_keys(self, flags: Flags) -> None:
        """Keys the candidate added to its input dicts (the runner took them off): flagged, not failed."""
        added = getattr(flags, "added_input_keys", None)
        if isinstance(added, list):
            self.added_keys += [str(k)[:120] for k in added[:20] if str(k)[:120] not in self.added_keys]

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
        runner_info = runner.request(None, args.compile_timeout_s, "starting the candidate's process",
                                     expect=Loaded).info
        if runner_info.pop("device") != self.device:
            raise Failure("runtime_error", "the candidate's process and the judge see different devices")
        result["environment"].update(runner_info)
        self.phases["waiting_for_runner"] = time.perf_counter() - t0
        self.round_trip_us = time_bound.round_trip_us(runner)

        # 2. Time the reference (and baseline) now, while no candidate code has run: once the candidate is imported,
        # work it leaves running (a GPU stream, a thread) could slow the reference down and inflate its speedup, and
        # the timings are reused by later evaluations of the session.
        with timing_lock(args.lock_dir, self.device):
            for w in timed:
                self.time_reference(w)

        t0 = time.perf_counter()
        check_us = runner.request(Import(self.runner_task), args.compile_timeout_s,
                                  "compiling (importing) the candidate", expect=Armed).check_us
        # Sent before any candidate code ran: trusted, only kept sane (time_bound.py)
        self.guard_us = min(check_us, 1e5) if isinstance(check_us, float) and check_us >= 0 else 0.0
        compile_s = runner.request(None, args.compile_timeout_s, "compiling (importing) the candidate",
                                   expect=Ready).compile_s
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
                seed = self.correctness_seed(name, i)
                t0 = time.perf_counter()
                pristine = self.inputs(w, seed)
                expected = self.reference(pristine)
                self.phases["reference"] += time.perf_counter() - t0
                t0 = time.perf_counter()
                out, got_inputs, before, seconds, flags = runner.request(
                    Call(name, w["params"], seed, first),
                    args.compile_timeout_s if first else args.call_timeout_s, where, expect=Output)
                if first:
                    result["compile_s"] += seconds  # the first call carries the JIT compile
                    first = False
                if before != fingerprint(pristine):
                    raise Failure("suspicious", f"{where}: the inputs in the candidate's process differed from the "
                                  "judge's before the call (make_inputs patched, or not deterministic)")
                check_flags(flags, where)
                self.note_added_keys(flags)
                t1 = time.perf_counter()  # time_bound.py: the runner fingerprints every timed call's output
                fingerprint(out)
                self.fingerprint_us[name] = min(self.fingerprint_us.get(name, math.inf),
                                                (time.perf_counter() - t1) * 1e6)
                self.check(out, got_inputs, pristine, expected, where, results[name])
                self.call_bytes[name] = nbytes(pristine) + nbytes(expected)
                del out, got_inputs, pristine, expected
                self.phases["correctness"] += time.perf_counter() - t0
            results[name]["correct"] = True
            if flags.reference_calls:
                result.setdefault("flags", []).append("calls_reference")

        # 3. Timing.
        notes = []
        with timing_lock(args.lock_dir, self.device):
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
                if self.device == "cuda":
                    results[name]["power_limited"] = self.power_limited.get(name, False)
                if name in base_timing:
                    base_us = base_timing[name]["mean_us"]
                    results[name].update(baseline_us=base_us, speedup_vs_baseline=base_us / mean)
        summarise(result, results, timed, notes, self.sources, bool(base_timing), self.added_keys,
                  self.host_timed)


def evaluate(session: Session, args, timings: dict, result: dict, ahead: dict | None = None) -> None:
    """Fill ``result`` in place; raise Failure for a candidate that does not pass. ``timings``: reference/baseline
    timings of an earlier evaluation, to reuse where they fit; ``ahead``: ``time_reference_ahead``'s."""
    if not args.task:
        raise Failure("runtime_error", "the evaluation's job names no task")
    task = read_task(args.task, args.workloads.split(",") if args.workloads else None)
    root = session.cfg["candidate"]
    form = candidate_form(task, root)
    result["environment"] = dict(session.environment)
    device = session.device
    result["timing_representative"] = device == "cuda"
    result["environment"]["timing"] = task["timing"]
    judge = None
    try:
        if device != "cuda" and (form == "torch_extension" or task["language"] in ("cuda", "cupy")):
            raise Failure("unavailable", f"this task's candidates are {task['language']} code and this machine has "
                          "no CUDA GPU")
        runner_task = {"reference": os.path.join(os.path.abspath(args.task), task["reference"]),
                       "solution_file": task["solution_file"], "entry_point": task["entry_point"],
                       "kind": task["entry_kind"], "form": form, "timing": task["timing"]}
        ahead = ahead or {}
        judge = Judge(args, task, result, timings, runner_task, session.timer, ahead.get("timings"))
        judge.phases["reference_timing"] += ahead.get("overrun_s", 0.0)
        judge.phases.update(session.phases)
        judge.run(session.runner)
    except Failure as f:
        if f.status in ("runtime_error", "timeout") and device == "cuda":
            result["environment"]["gpu_healthy_after"] = gpu_healthy()
        raise
    finally:
        session.close()
        if judge is not None:
            result["phases"] = {k: round(v, 4) for k, v in judge.phases.items()}
            if judge.measured:  # taken before candidate code ran: good for the next evaluation, pass or fail
                result["reference_timings"] = {"key": judge.timings_key, "workloads": judge.measured}


def time_reference_ahead(session: Session, args, job: JobWatch) -> dict:
    """A prestarted process given its task (``--time-reference-ahead``) times the reference (and baseline) while it
    waits for the job, holding the GPU's timing lock, before any candidate code exists: a search's first evaluation
    then does not pay for it while the LLM writes the first candidate (docs/timing.md, "Other costs measured"). Stops
    early when the job comes; the evaluation times what is left. {} when the task cannot be read or its reference
    fails: the evaluation meets and reports the same problem."""
    t0 = time.perf_counter()
    progress(AHEAD)
    try:
        task = read_task(args.task, args.workloads.split(",") if args.workloads else None)
        judge = Judge(args, task, {}, {}, None, session.timer)
        with timing_lock(args.lock_dir, judge.device):
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


def main(argv: list[str] | None = None) -> int:
    args = read_arguments(argv, __doc__.splitlines()[0])
    faulthandler.enable()
    result_key = os.environ.pop(RESULT_KEY_ENV, "")

    start = time.perf_counter()
    result = new_result()
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
    write_signed(result, args.out, result_key)
    progress(f"done: {result['status']}")
    return 0


def process_main() -> None:
    """The judge process: hardened, tied to its parent, and ended without interpreter teardown."""
    harden()
    if os.environ.get("KSEARCH_PARENT_PID"):  # before the slow torch import: a killed search takes us along at once
        die_with_parent(int(os.environ["KSEARCH_PARENT_PID"]))
    code = main()
    # Skip interpreter teardown (torch and Triton take ~0.5 s to unload).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    process_main()
