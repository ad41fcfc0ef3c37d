"""Evaluate one kernel candidate and write an EvalResult-shaped JSON: the judge process of SubprocessEvaluator.

    python ksearch_graph/harness/judge/judge.py --task TASK_DIR --candidate CANDIDATE_DIR --out RESULT.json
        [--workloads NAME,NAME] [--seeds-from-env] [--time-budget-s S] [--compile-timeout-s S]
        [--call-timeout-s S] [--cache-dir DIR] [--lock-dir DIR] [--no-network-isolation]
    python ksearch_graph/harness/judge/judge.py --job-from-stdin --candidate CANDIDATE_DIR --out RESULT.json [...]

Started by path and importing only the standard library, torch and this package (never the rest of ksearch_graph):
this folder is what a GPU host needs. ``tools/evaluate_candidate.py`` runs it from a checkout.

Two processes, and why. This process (the judge) never imports candidate code, and believes nothing the candidate's
process says. It starts that process in an OS sandbox (``sandbox.py``: no network, no view of the user's files or of
other processes) and drives it over one socket (``wire.py``, every message parsed strictly). The judge makes every
input set itself with the task's ``make_inputs`` from seeds drawn per evaluation, lends it in fresh memory by
file descriptor (``lending.py``), and reads every output out of the slot it lent into its own memory before it
checks anything (``candidate_calls.py``). The reference, the seeds and the comparison live where candidate code cannot
reach them.

Order of work:
1. Start the candidate's process: it imports torch while we do, then waits; both processes make their device
   contexts and timers only while holding the device for it (``gpu_share.py``: never while another evaluation on
   the same GPU is timed), and the candidate's process says it is loaded. A parent may start both processes before
   it has the job (``--job-from-stdin``): the imports then cost the evaluation nothing. Time the reference (and the
   task's baseline) on fresh inputs, holding the device's timing lock, while no candidate code has run; timings of an
   earlier evaluation of the same session are reused when the parent passes them in the job (same task code, same
   GPU), and a prestarted process given its task times them while it waits (``time_reference_ahead``). Calibrate the
   judge's clock through the candidate's process, still before any candidate code exists (``Calibrate``). Then the
   candidate is imported (compile time, under its own limit).
2. Correctness: every workload, ``correctness_seeds`` input sets each. Shape, dtype, NaN/Inf positions, tolerance,
   trivially-small outputs, and that the inputs the judge lent came back unchanged (read in its own mapping).
3. Timing of the timed workloads, holding the GPU's timing lock, in bursts (``timing.timed_burst`` on the
   candidate's side): every timed call on inputs the judge makes when the candidate's process is ready for it, under
   sustained load (a heat before, untimed fillers between calls for power-limited workloads: policy.py, fill_duty),
   after the judge's L2 flush and behind the launch cover's hold, events plus a device-wide synchronize; the judge's
   clock around each call bounds what the candidate's process reports (time_bound.py). After each burst the judge
   picks which of its copies of the outputs to re-check against the reference (the first and last timed call, and a
   random fifth of the others): the candidate cannot tell which.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import time
import traceback

if __name__ == "__main__" and not __package__:  # started by path: import the package, not this folder's files
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    __package__ = "ksearch_graph.harness.judge"  # noqa: A001

from ksearch_graph.harness.isolation import die_with_parent, harden, isolate_judge_network  # noqa: E402
from ksearch_graph.harness.job import (  # noqa: E402
    AHEAD,
    JUDGE_CRASH,
    RECEIVED,
    RESULT_KEY_ENV,
    WAITING,
    JudgeOptions,
)
from ksearch_graph.harness.judge.evaluate import Judge, evaluate  # noqa: E402
from ksearch_graph.harness.judge.gpu_share import TIMING  # noqa: E402
from ksearch_graph.harness.judge.input_sizes import gib  # noqa: E402
from ksearch_graph.harness.judge.memory_watch import MemoryWatch  # noqa: E402
from ksearch_graph.harness.judge.results import new_result, write_signed  # noqa: E402
from ksearch_graph.harness.judge.session import JobWatch, Session, read_job  # noqa: E402
from ksearch_graph.harness.reporting import Failure, clip, progress  # noqa: E402
from ksearch_graph.harness.tasks import read_task  # noqa: E402


def watch_memory(args, result_key: str) -> MemoryWatch:
    """The judge's own memory limit, which a GPU host cannot give it as an address-space limit: past it, the result
    says so and the process ends (the inputs and reference outputs it holds are the task's, the output slot is sized
    by the reference's output)."""
    limit = args.memory_limit_bytes

    def over(rss: int) -> None:
        out = new_result() | {"status": "unavailable", "log_excerpt": clip(
            f"the judge's process grew to {gib(rss)} of host memory, over its limit of {gib(limit)} "
            "(--memory-limit-gb): the task's inputs and reference outputs it holds; shrink the workload or raise "
            "the limit")}
        write_signed(out, args.out, result_key)
        progress("done: unavailable (the judge's memory limit)")
        os._exit(0)

    return MemoryWatch(limit, over)


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
        judge = Judge(args, task, {}, {}, None, session.timer, session.share)
        with judge.share.hold(TIMING):
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


def main(argv: list[str] | None = None, network: str = "no (started in-process)") -> int:
    args = JudgeOptions.parse(argv, __doc__.splitlines()[0])
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
            if session is not None:  # both processes are ready: Session waited for the candidate's "loaded"
                if args.time_reference_ahead and args.task:
                    job = JobWatch(args.standby_limit_s)
                    ahead = time_reference_ahead(session, args, job)
            progress(WAITING)
        bad_job = None
        try:
            got = read_job(args.standby_limit_s)
        except ValueError as e:
            got, bad_job = None, e
        if got is None and bad_job is None:  # the parent gave up on this prestarted evaluation
            if session is not None:
                session.close()
            return 0
        progress(RECEIVED)
        if bad_job is not None:  # the parent's fault, never the candidate's
            early = early or Failure("runtime_error", f"{JUDGE_CRASH}the evaluation's job: {bad_job}")
        else:
            args, timings = args.with_job(got), got.timings
        if waiting:  # started ahead of time: the evaluation's clock starts when the job came, imports were off it
            start = job.at if job is not None and job.at is not None else time.perf_counter()
            if session is not None:
                session.phases = {"spawn": 0.0, "imports": 0.0, "waiting_for_runner": 0.0}
            prestarted = True
    try:
        if early is not None:
            raise early
        with watch_memory(args, result_key):
            evaluate(session, args, timings, result,
                     ahead if ahead.get("task") == os.path.abspath(args.task or "") else None)
    except Failure as f:
        result["status"], result["log_excerpt"] = f.status, clip(f.message)
    except BaseException as e:  # a harness or task problem
        result["log_excerpt"] = clip(JUDGE_CRASH + "".join(traceback.format_exception(e)))
    if result["status"] != "passed":
        result["score"] = 0.0
    if prestarted:
        result["environment"]["prestarted"] = True
    result["environment"]["judge_network_isolated"] = network
    result["wall_s"] = time.perf_counter() - start
    write_signed(result, args.out, result_key)
    progress(f"done: {result['status']}")
    return 0


def process_main() -> None:
    """The judge process: hardened, off the network, tied to its parent, and ended without interpreter teardown."""
    harden()
    network = isolate_judge_network()
    if os.environ.get("KSEARCH_PARENT_PID"):  # before the slow torch import: a killed search takes us along at once
        die_with_parent(int(os.environ["KSEARCH_PARENT_PID"]))
    code = main(network=network)
    # Skip interpreter teardown (torch and Triton take ~0.5 s to unload).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    process_main()
