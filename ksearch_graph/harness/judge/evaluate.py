"""One evaluation in the judge process: the ``Judge`` (inputs it makes, the reference, the checks, the timing through
its own clock) and ``evaluate``, its run for one job. judge.py (the process's entry, and ``time_reference_ahead`` for
a process still waiting for its job) says the order of work and why there are two processes."""

from __future__ import annotations

import math
import os
import random
import secrets
import statistics
import time

from ksearch_graph.harness import compile_cache
from ksearch_graph.harness._torch import load_torch  # no module here imports torch before load_torch
from ksearch_graph.harness.gpu import gpu_healthy
from ksearch_graph.harness.guards import InterpreterHooks
from ksearch_graph.harness.job import (
    LOADING_TASK,
    TASK_REFERENCE,
)
from ksearch_graph.harness.judge import time_bound
from ksearch_graph.harness.judge.candidate_calls import CandidateCalls, TimedCall, reference_files
from ksearch_graph.harness.judge.compare import compare, same
from ksearch_graph.harness.judge.gpu_share import CHECKING, TIMING, DeviceShare
from ksearch_graph.harness.judge.input_sizes import InputsTooLarge, check_input_sizes
from ksearch_graph.harness.judge.reply_checks import check_burst_timings, check_flags, work_us
from ksearch_graph.harness.judge.results import summarise
from ksearch_graph.harness.judge.runner_process import RunnerProcess
from ksearch_graph.harness.judge.session import SEED_ENV, TRACE_ENV, Session
from ksearch_graph.harness.modules import load_module
from ksearch_graph.harness.policy import POLICY
from ksearch_graph.harness.reporting import Failure, TimingTrace, describe, progress
from ksearch_graph.harness.requirements import unmet_requirement
from ksearch_graph.harness.task_checks import run_check
from ksearch_graph.harness.tasks import candidate_form, derive_seed, prepare, read_task, timings_key
from ksearch_graph.harness.tensors import as_tensors, clone, nbytes
from ksearch_graph.harness.timer import Timer
from ksearch_graph.harness.timing import (
    Bursts,
    SideStreamRule,
    burst_memory_bytes,
    burst_size,
    honest_times,
    precise_enough,
    timed_burst,
)
from ksearch_graph.harness.wire import Import, Imported, Load, Prepared
from ksearch_graph.harness.writable import without_writable, writable_paths


class Judge:
    """``cached``: reference timings of an earlier evaluation ({"key", "workloads"}); ``ahead``: those this process
    measured while it waited for the job (``time_reference_ahead``); ``timer``: the session's. A judge with no
    ``runner_task`` only times the reference: its base seed is its own, the hidden one stays for the evaluation's."""

    def __init__(self, args, task: dict, result: dict, cached: dict, runner_task: dict | None, timer: Timer,
                 share: DeviceShare, ahead: dict | None = None):
        self.args, self.task, self.result = args, task, result
        self.runner_task = runner_task  # what the candidate's process needs to import the candidate
        self.tol = task["tolerance"]
        self.writable = writable_paths(task)  # output buffers among the inputs: they may come back changed
        hidden = args.seeds_from_env and runner_task is not None
        self.base_seed = int(os.environ.pop(SEED_ENV)) if hidden else secrets.randbits(62)
        self.rng = random.Random(secrets.randbits(64))  # which timed calls get re-checked
        self.timer = timer  # the Session's: made before this process's CUDA context (see gpu.CudaRuntime)
        self.timing_trace = TimingTrace(os.environ.get(TRACE_ENV))
        self.timer.heated = False  # the first heat here may start from a GPU that cooled while this process waited
        self.timer.use_timing(task["timing"])
        self.host_timed: list[str] = []  # workloads whose every timed call read 0 us of device time
        self.device = "cuda" if timer.cuda else "cpu"  # the session's, which made the timer
        self.share = share  # the Session's: timing alone on the device, checks side by side
        self.min_runs = POLICY.min_runs_gpu if self.device == "cuda" else POLICY.min_runs
        self.ref = load_module("ksearch_reference", os.path.join(args.task, task["reference"]))
        self.baseline = None
        if task["baseline"]:
            base = load_module("ksearch_baseline", os.path.join(args.task, task["baseline"]))
            self.baseline = getattr(base, task["entry_point"])
        # The reference's timed calls take the same steps as the candidate's, its interpreter-hook check included (on
        # CPU no device clock leaves that host time out). Made after the task's modules are imported: the check puts
        # back what it saw then (gc callbacks, trace and profile functions) after every call.
        self.timer.hooks = InterpreterHooks()
        self.phases = {"reference_timing": 0.0, "calibration": 0.0,
                       "waiting_for_compile": 0.0, "reference": 0.0, "correctness": 0.0, "timing": 0.0,
                       "checks": 0.0,
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
        self.calibrations: dict[str, time_bound.Calibration | None] = {}  # per timed workload (time_bound.py)
        self.device_floor_us: dict[str, float] = {}  # per timed workload (calibrate)
        self.overheads: dict[str, list[float]] = {}  # per timed workload: its calibration calls' (calibrate)
        self.calls: CandidateCalls | None = None  # made in run(), with the candidate's process

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
        """Reference or baseline timing: the candidate's procedure (inputs made just before each call, the L2
        flushed, the launch cover's hold), run here on this side's functions."""
        torch = load_torch()
        times, hosts, repeated = [], [], []  # repeated: (mean untimed us, fastest timed us) per burst
        kind = self.task["entry_kind"]
        warm = self.inputs(w, derive_seed(self.base_seed, w["name"], tag, -1))
        f, a = prepare(fn, warm, kind, self.device)
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
                done = []

                def next_call(k):
                    inputs = self.inputs(w, derive_seed(self.base_seed, w["name"], tag, first + k))  # noqa: B023
                    self.timer.flush_l2()
                    return prepare(fn, inputs, kind, self.device)

                timed_burst(self.timer, self.burst_size(first, call_bytes, call_s, self.timer.power_limited),
                            next_call, lambda k, out, t: done.append(t), filler=(f, a))  # noqa: B023
                if self.timer.untimed_us and done:
                    repeated.append((statistics.fmean(self.timer.untimed_us), min(work_us(t) for t in done)))
                times += [t[0] for t in done]
                hosts += [t[3] for t in done]
                bursts.add(first, len(done), burst_started, self.timer.spent_s["heat"] - heated,
                           self.timer.power_limited)
                self.timing_trace.write(tag, w["name"], first, done)
        times, on_host = honest_times(times, hosts)
        out = {"mean_us": statistics.fmean(times), "runs": len(times)} | ({"host_clock": True} if on_host else {})
        if repeated:  # its burst most sped up by repeated inputs: what an honest kernel's warm caches can give
            out["repeated_us"], out["fastest_us"] = min(repeated, key=lambda r: r[0] / max(r[1], 1e-9))
        return out

    def calibrate(self, w: dict) -> None:
        """The judge's clock around calls that do nothing, made through the candidate's process before any candidate
        code exists, on this workload's inputs and outputs (time_bound.py)."""
        t0 = time.perf_counter()
        inputs = self.inputs(w, derive_seed(self.base_seed, w["name"], "calibrate"))
        expected = self.reference(inputs)
        calls = self.calls.calibrate(w["name"], inputs, expected, POLICY.calibration_calls,
                                     self.args.call_timeout_s)
        overheads = time_bound.overheads_us([c.span_us for c in calls], [c.times[0] for c in calls])
        self.overheads[w["name"]] = overheads[1:] or overheads
        self.calibrations[w["name"]] = time_bound.calibrate(self.overheads[w["name"]], cpu=self.device != "cuda")
        # The device time of a timed call that does nothing: what every timed call carries besides its work.
        self.device_floor_us[w["name"]] = min((c.times[0] for c in calls), default=0.0)
        self.timing_trace.write("calibration", w["name"], 0, [c.times for c in calls],
                                bound={"spans_us": [c.span_us for c in calls],
                                       "steps_us": [c.steps_us for c in calls]})
        self.phases["calibration"] += time.perf_counter() - t0

    def time_candidate(self, w: dict) -> tuple[list[float], list[str]]:
        name, notes = w["name"], []
        where = f"workload {name}, timed call"
        call_s = self.calls.warm(name, self.inputs(w, derive_seed(self.base_seed, name, "warm")),
                                 self.args.call_timeout_s, f"{where} (warm-up)")
        # The candidate's process says how long its warm-up call took; it only sizes bursts and their time limit.
        call_s = min(call_s, self.args.call_timeout_s)
        times, tails, hosts, started, side = [], [], [], time.perf_counter(), SideStreamRule()
        least = []  # per kept call: the least the judge's clock lets it be counted at (time_bound.least_credible_us)
        made = 0  # calls made, a dropped burst's included: every call gets inputs of its own
        clock = time_bound.ContradictionRule(  # bursts the judge's clock contradicts
            POLICY.bound_max_dropped if self.device == "cuda" else POLICY.bound_max_dropped_cpu)
        bursts = Bursts()
        cal = self.calibrations.get(name)
        while True:
            first, burst_started, heated = made, time.perf_counter(), self.phases["timing_heat"]
            seeds = [derive_seed(self.base_seed, name, "time", first + k)
                     for k in range(self.burst_size(len(times), self.call_bytes[name], call_s,
                                                    self.power_limited.get(name, False)))]
            made += len(seeds)
            # A later burst's heat: POLICY.heat_min_s (or POLICY.heat_s), plus the calls still in flight when it ends.
            heat_s = (POLICY.heat_min_s if first else POLICY.heat_max_s) + 2 * call_s
            deadline = time.monotonic() + self.args.call_timeout_s + (
                len(seeds) * (1 + POLICY.fill_max) + 2) * 4 * call_s + heat_s + len(seeds) * 0.5
            calls, untimed, flags = self.calls.burst(
                name, self.inputs(w, derive_seed(self.base_seed, name, "heat", first)),
                lambda k: self.inputs(w, seeds[k]), len(seeds), first == 0, deadline, where)  # noqa: B023
            check_flags(flags, where)
            self.power_limited[name] = flags["power_limited"]
            for part in ("heat", "fill"):  # the process's totals so far: informative only, so just kept sane
                spent = flags[f"{part}_s"]
                if spent < 1e6:
                    self.phases[f"timing_{part}"] = spent
            timed = [c.times for c in calls]
            ref = self.ref_timing.get(name) or {}
            check_burst_timings(timed, untimed, where, self.device_floor_us.get(name, 0.0),
                                (ref["repeated_us"], ref["fastest_us"]) if "repeated_us" in ref else None)
            device = [t[0] for t in timed]
            spans = [c.span_us for c in calls]
            reported = honest_times(device, [t[3] for t in timed])[0]
            verdict, why = clock.judge(spans, reported, cal, f"{first + 1}-{made}")
            bound = time_bound.trace_figures(spans, cal, [c.steps_us for c in calls])
            if verdict == "fail":
                self.timing_trace.write("candidate", name, first, timed, dropped=True, bound=bound)
                raise Failure("suspicious", f"{where}s {first + 1}-{made}: {why}: its timer was tampered with")
            if verdict == "keep":
                verdict = side.verdict(device, [t[1] - t[2] for t in timed])
            self.timing_trace.write("candidate", name, first, timed, dropped=verdict == "drop", bound=bound)
            if verdict == "drop":
                notes.append(f"{name}: {why}" if why else f"{name}: calls {first + 1}-{made} left {side.extra_us:.0f} "
                             "us of device work past their end event on average (work on another stream?); dropped "
                             "and timed again")
            else:
                times += device
                tails += [t[1] for t in timed]
                hosts += [t[3] for t in timed]
                least += [time_bound.least_credible_us(span, cal) for span in spans]
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
            self.recheck(w, calls, seeds, first, last, where)
            del calls
            if last:
                break
        if side.charged:
            notes.append(f"{name}: the device stayed busy {side.extra_us:.0f} us after the call ended on its stream "
                         f"in a burst timed after {side.dropped} dropped for it (work on another stream?); every call "
                         "timed until the whole device was idle")
        times, on_host = honest_times(side.reported(times, tails), hosts)
        raised = sum(t < low for t, low in zip(times, least))
        if raised:
            times = [max(t, low) for t, low in zip(times, least)]
            notes.append(f"{name}: {raised} of {len(times)} timed calls reported less than the judge's clock leaves "
                         "for them beyond its slack; counted at what it leaves")
        if on_host:
            self.host_timed.append(name)
            notes.append(f"{name}: every timed call read 0 us of device time (no work between its events: a view "
                         "returned, or the work done on the host); timed by the host clock around each call instead")
        return times, notes

    def recheck(self, w: dict, calls: list[TimedCall], seeds: list[int], first: int, last: bool, where: str) -> None:
        """The judge's copies of some of a burst's outputs against the reference: chosen now, after the burst, so
        the candidate cannot tell which (the first and last timed calls, and a random share of the others)."""
        chosen = [i for i in range(len(calls)) if (first == 0 and i == 0) or (last and i == len(calls) - 1)
                  or self.rng.random() < POLICY.check_probability]
        for i in chosen:
            t1 = time.perf_counter()
            pristine = self.inputs(w, seeds[i])
            expected = self.reference(pristine)
            self.phases["reference"] += time.perf_counter() - t1
            self.check(calls[i].output, None, pristine, expected,
                       f"{where} {first + i + 1} (passed the correctness check)")
            del pristine, expected

    # -- checks ----------------------------------------------------------------------------------------------------

    def check(self, out, got_inputs, pristine, expected, where: str, row: dict | None = None) -> tuple[float, float]:
        """Inputs unchanged (where ``got_inputs`` is given: the judge's own view of what it lent; declared output
        buffers left out) and output right: the elementwise comparison, then the task's own check where it has one
        (on the judge's copies of ``pristine`` and of the output); the errors go into ``row`` either way."""
        t0 = time.perf_counter()
        unchanged = got_inputs is None or same(without_writable(pristine, self.writable),
                                               without_writable(got_inputs, self.writable))
        if unchanged:
            if self.task["check"]:
                # No elementwise errors: the check may accept another answer (a QR factorisation is not unique).
                (status, message), max_err, max_rel = run_check(self.args.task, self.task, pristine, out, expected), 0, 0
            else:
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
            raise Failure("runtime_error", f"{TASK_REFERENCE} (a task bug, not the candidate's):\n"
                          + describe(e, os.path.abspath(self.args.task))) from None
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
        self.calls = CandidateCalls(runner, self.timer, self.device)

        # 1. The candidate's process has imported torch and made its timer (Session), and waits; no candidate code
        # has run yet.
        runner.request(Import(self.runner_task), args.compile_timeout_s, LOADING_TASK, expect=Prepared)

        # Time the reference (and baseline) now, and calibrate the judge's clock, while no candidate code has run:
        # once the candidate is imported, work it leaves running (a GPU stream, a thread) could slow the reference
        # down and inflate its speedup, and the timings are reused by later evaluations of the session.
        with self.share.hold(TIMING):
            for w in timed:
                self.time_reference(w)
            for w in timed:
                progress(f"calibrating the judge's clock on {w['name']}")
                self.calibrate(w)
        if self.device == "cuda":  # CPU time of the candidate's tree does not drift so (time_bound.pooled)
            self.calibrations = time_bound.pooled(self.calibrations, self.overheads)

        t0 = time.perf_counter()
        progress("importing the candidate")
        with self.share.hold(CHECKING):  # candidate code runs from here on, and may touch the device
            compile_s = runner.request(Load(), args.compile_timeout_s, "compiling (importing) the candidate",
                                       expect=Imported).compile_s
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
                with self.share.hold(CHECKING):
                    t0 = time.perf_counter()
                    pristine = self.inputs(w, seed)
                    expected = self.reference(pristine)
                    self.phases["reference"] += time.perf_counter() - t0
                    t0 = time.perf_counter()
                    out, got_inputs, seconds, flags, regions = self.calls.call(
                        name, pristine, expected, first, args.compile_timeout_s if first else args.call_timeout_s,
                        where)
                    try:
                        if first:
                            result["compile_s"] += seconds  # the first call carries the JIT compile
                            first = False
                        check_flags(flags, where)
                        self.check(out, got_inputs, pristine, expected, where, results[name])
                    finally:
                        del got_inputs
                        for r in regions:
                            r.close()
                    self.call_bytes[name] = nbytes(pristine) + nbytes(expected)
                    del out, pristine, expected
                    self.phases["correctness"] += time.perf_counter() - t0
            results[name]["correct"] = True
            if flags["reference_calls"]:
                result.setdefault("flags", []).append("calls_reference")

        # 3. Timing.
        notes = []
        with self.share.hold(TIMING):
            for w in timed:
                name = w["name"]
                progress(f"timing {name}")
                t0 = time.perf_counter()
                times, more = self.time_candidate(w)
                self.phases["timing"] += time.perf_counter() - t0
                notes += more
                mean = max(statistics.fmean(times), 1e-3)  # a call below the clock's resolution reads 1 ns
                ref_us = max(ref_timing[name]["mean_us"], 1e-3)
                results[name].update(latency_us=mean, median_us=statistics.median(times),
                                     std_us=statistics.stdev(times), runs=len(times), reference_us=ref_us,
                                     speedup=ref_us / mean)
                if self.device == "cuda":
                    results[name]["power_limited"] = self.power_limited.get(name, False)
                if name in base_timing:
                    base_us = base_timing[name]["mean_us"]
                    results[name].update(baseline_us=base_us, speedup_vs_baseline=base_us / mean)
        summarise(result, results, timed, notes, self.sources, bool(base_timing), [], self.host_timed)


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
    source = compile_cache.source_key(root)
    try:
        if device != "cuda" and (form == "torch_extension" or task["language"] in ("cuda", "cupy")):
            raise Failure("unavailable", f"this task's candidates are {task['language']} code and this machine has "
                          "no CUDA GPU")
        missing = unmet_requirement(task, device)
        if missing:
            raise Failure("unavailable", missing)
        task_dir = os.path.abspath(args.task)
        runner_task = {"reference": task["reference"], "reference_files": reference_files(task_dir),
                       "solution_file": task["solution_file"], "entry_point": task["entry_point"],
                       "kind": task["entry_kind"], "form": form, "timing": task["timing"]}
        # Before any candidate code runs: what earlier evaluations of this same source compiled (compile_cache.py).
        compile_cache.restore(args.cache_dir, source, session.cache)
        ahead = ahead or {}
        judge = Judge(args, task, result, timings, runner_task, session.timer, session.share, ahead.get("timings"))
        try:  # before any input exists: a workload whose copies cannot fit the judge stops here (input_sizes.py)
            # On a copy of the task's module: the meta pass would leave meta tensors in its caches (loaded blobs).
            sizing = load_module("ksearch_reference_sizes", os.path.join(task_dir, task["reference"]))
            check_input_sizes(sizing, task, args.memory_limit_bytes, "the judge's memory limit (--memory-limit-gb)")
        except InputsTooLarge as e:
            raise Failure("unavailable", str(e)) from None
        judge.phases["reference_timing"] += ahead.get("overrun_s", 0.0)
        judge.phases.update(session.phases)
        judge.run(session.runner)
    except Failure as f:
        if f.status in ("runtime_error", "timeout") and device == "cuda":
            result["environment"]["gpu_healthy_after"] = gpu_healthy()
        raise
    finally:
        session.close()
        compile_cache.keep(args.cache_dir, source, session.cache)
        if judge is not None:
            judge.phases["waiting_for_device"] = session.share.waited_s
            result["phases"] = {k: round(v, 4) for k, v in judge.phases.items()}
            # every hold of this session's, the reference timed ahead and the candidate's process stopped included
            result["device_spans"] = [[what, round(a, 4), round(b, 4)] for what, a, b in session.share.spans]
            if judge.measured:  # taken before candidate code ran: good for the next evaluation, pass or fail
                result["reference_timings"] = {"key": judge.timings_key, "workloads": judge.measured}


