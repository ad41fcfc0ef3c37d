"""Evaluate one kernel candidate and write an EvalResult-shaped JSON: the child side of SubprocessEvaluator.

    python _evaluate_child.py --task TASK_DIR --candidate CANDIDATE_DIR --out RESULT.json
                              [--workloads NAME,NAME] [--seeds-from-env] [--time-budget-s S]

Standalone on purpose (stdlib + torch, triton only when the candidate imports it, never ksearch_graph): this one
file is what gets copied to a GPU host. ``tools/evaluate_candidate.py`` runs it from a checkout.

Order of work, and why:
1. Before any candidate code is imported, generate every input set, compute the reference outputs, time the
   reference, and keep the expected outputs only as host bytes. The candidate cannot then patch torch or the
   reference to agree with itself, cannot find expected tensors through the garbage collector, and cannot read
   them from freed device memory (device buffers are overwritten with NaN before they are freed).
2. Import the candidate (import time counts as compile time).
3. Correctness on every workload, each call on its own copy of freshly regenerated inputs; stop at the first failure.
4. Timing of every workload, each call on a fresh copy of one of the input sets in turn, then a re-check of the
   last timed call's output and inputs.
Input seeds derive from a random base seed (``KSEARCH_EVAL_SEED`` with --seeds-from-env, else drawn here), new for
every evaluation and never passed to the candidate. These checks stop cheap and accidental cheats; code running in
this process could still reach the harness's own state, so they are not a sandbox against a determined adversary.
"""

from __future__ import annotations

import argparse
import copy
import faulthandler
import hashlib
import importlib.util
import json
import math
import os
import platform
import secrets
import statistics
import sys
import time
import traceback
from typing import NamedTuple


def _die_with_parent() -> None:
    """If the search process is killed (kill -9, OOM), do not keep a GPU busy for nobody.

    Linux only: ask the kernel for SIGKILL when the parent dies, then check it has not died already.
    """
    parent = os.environ.get("KSEARCH_PARENT_PID")
    if not parent or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        return
    if os.getppid() != int(parent):
        os._exit(1)


if __name__ == "__main__":
    _die_with_parent()  # before the slow torch import: a search killed meanwhile takes us along at once

import torch  # noqa: E402  (does not import triton, so TRITON_INTERPRET can still be set below)

SEED_ENV = "KSEARCH_EVAL_SEED"
LOG_LIMIT = 2000
MIN_RUNS, MAX_RUNS = 3, 100
TARGET_RSE = 0.01  # stop timing once the relative standard error of the mean is below 1%
FLUSH_BYTES = 256 << 20  # at least 2x the L2 of any current GPU (H200: 50 MB)
ESCAPE_SLACK_US = 20.0  # device work past a call's end event beyond the reference's, before it counts as the call's

DEVICE = "cpu"  # set once by evaluate()


class Failure(Exception):
    """Ends the evaluation with ``status``; ``message`` becomes the log excerpt the LLM sees."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def progress(msg: str) -> None:
    # The parent shows the last of these lines when it has to kill us, so a hang says where it hung.
    print(f"[ksearch-eval] {msg}", file=sys.stderr, flush=True)


def clip(text: str, limit: int = LOG_LIMIT) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def describe(exc: BaseException, root: str) -> str:
    """The exception message plus the last frames of the candidate's own code, not the whole traceback."""
    frames, chain = [], exc
    while chain is not None:  # Triton's interpreter re-raises kernel errors `from` the original one
        frames += [f for f in traceback.extract_tb(chain.__traceback__) if f.filename.startswith(root)]
        chain = chain.__cause__ or chain.__context__
    text = "".join(f'  File "{f.filename}", line {f.lineno}, in {f.name}\n    {f.line}\n' for f in frames[-2:])
    text += "".join(traceback.format_exception_only(type(exc), exc))
    return clip(text.replace(root + os.sep, ""))


def load_module(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # Triton's JIT and dataclasses look the module up by name
    spec.loader.exec_module(module)
    return module


def derive_seed(base: int, workload: str, index: int) -> int:
    digest = hashlib.sha256(f"{base}:{workload}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


# --- tensors and nested inputs (tuples, lists and dicts of tensors and plain values) ---------------------------


def clone(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(clone(v) for v in value)
    if isinstance(value, dict):
        return {k: clone(v) for k, v in value.items()}
    return copy.deepcopy(value)


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
            return False
        equal = a == b
        if a.is_floating_point() or a.is_complex():
            equal |= a.isnan() & b.isnan()
        return bool(equal.all())
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def as_tensors(value) -> list | None:
    """A tensor or a tuple/list of tensors as a list; None for anything else."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, torch.Tensor) for v in value):
        return list(value)
    return None


def to_host_bytes(t) -> tuple:
    """Raw bytes plus dtype and shape: not a tensor, so not reachable as one from candidate code."""
    host = t.detach().to("cpu").contiguous()
    return host.reshape(-1).view(torch.uint8).numpy().tobytes(), host.dtype, tuple(host.shape)


def from_host_bytes(packed: tuple):
    data, dtype, shape = packed
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)


def scrub(value) -> None:
    """Overwrite the reference's device outputs before they are freed, so a candidate's torch.empty cannot
    hand back the expected answer from the allocator's cache."""
    for t in as_tensors(value) or []:
        t.detach().fill_(float("nan") if t.is_floating_point() else 0)


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


# --- correctness ------------------------------------------------------------------------------------------------


def index_of(flat_index: int, shape: tuple) -> list[int]:
    idx = []
    for size in reversed(shape):
        idx.append(flat_index % size)
        flat_index //= size
    return idx[::-1]


def compare(out, expected: list[tuple], tol: dict) -> tuple[str | None, str, float]:
    """Check one output against the expected host tensors: (failure status or None, message, max abs error)."""
    got = as_tensors(out)
    if got is None:
        return "incorrect_shape", f"returned {type(out).__name__}, expected a torch.Tensor", math.inf
    if len(got) != len(expected):
        return "incorrect_shape", f"returned {len(got)} tensors, expected {len(expected)}", math.inf
    worst = 0.0
    for k, (o, packed) in enumerate(zip(got, expected)):
        r = from_host_bytes(packed)
        name = "output" if len(got) == 1 else f"output[{k}]"
        if tuple(o.shape) != tuple(r.shape):
            return "incorrect_shape", f"{name} has shape {tuple(o.shape)}, expected {tuple(r.shape)}", math.inf
        if o.dtype != r.dtype:
            return "incorrect_dtype", f"{name} has dtype {o.dtype}, expected {r.dtype}", math.inf
        if o.numel() == 0:
            continue
        o = o.detach().to("cpu", torch.float64)
        r = r.to(torch.float64)
        special = (o.isnan() != r.isnan()) | (o.isposinf() != r.isposinf()) | (o.isneginf() != r.isneginf())
        if special.any():
            i = index_of(int(special.flatten().nonzero()[0]), tuple(o.shape))
            return (
                "incorrect_numerical",
                f"{name}: NaN/Inf pattern differs from the reference at {int(special.sum())} of {o.numel()} "
                f"elements (first at {i}: got {o[tuple(i)].item():.6g}, expected {r[tuple(i)].item():.6g})",
                math.inf,
            )
        finite = o.isfinite() & r.isfinite()
        err = torch.where(finite, (o - r).abs(), torch.zeros_like(o))
        bad = finite & (err > tol["atol"] + tol["rtol"] * r.abs())
        max_err = float(err.max())
        worst = max(worst, max_err)
        if 1.0 - bad.sum().item() / o.numel() < tol["matched_ratio"]:
            i = index_of(int(err.flatten().argmax()), tuple(o.shape))
            return (
                "incorrect_numerical",
                f"{name}: {int(bad.sum())} of {o.numel()} elements outside atol={tol['atol']:g}, "
                f"rtol={tol['rtol']:g}; max abs error {max_err:.4g} at {i} "
                f"(got {o[tuple(i)].item():.6g}, expected {r[tuple(i)].item():.6g})",
                max_err,
            )
    return None, "", worst


# --- timing -----------------------------------------------------------------------------------------------------


class Timed(NamedTuple):
    times: list[float]  # microseconds per call, between events on the calling stream
    tails: list[float]  # microseconds from each call's end event until the whole device was idle
    out: object  # for a re-check: the last call's output,
    args: tuple  # its inputs after the call,
    which: int  # and the input set they were copied from


def bench(fn, input_sets: list, budget_s: float, flush) -> Timed:
    """Time fn on rotating fresh copies of the inputs, until the mean is precise or the budget is spent."""
    fn(*clone(input_sets[0]))  # warm-up: compile, autotune and caches stay outside the timed region
    sync()
    if DEVICE == "cuda":
        # An idle GPU lowers its clocks; keep it busy a moment so the first timed calls do not pay for the ramp.
        busy_until = time.perf_counter() + 0.05
        while time.perf_counter() < busy_until:
            flush.zero_()
            torch.cuda.synchronize()
    times, tails, start_s = [], [], time.perf_counter()
    while len(times) < MAX_RUNS:
        which = len(times) % len(input_sets)
        args = clone(input_sets[which])
        if DEVICE == "cuda":
            # Evict inputs and earlier results from L2. The flush also keeps the GPU busy while the call is being
            # launched, so host-side launch overhead does not land in the window.
            flush.zero_()
            start, end, idle = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            start.record()
            out = fn(*args)
            end.record()
            torch.cuda.synchronize()  # waits for every stream: catches work the call left running elsewhere
            idle.record()
            idle.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
            tails.append(end.elapsed_time(idle) * 1e3)
        else:
            t0 = time.perf_counter()
            out = fn(*args)
            times.append((time.perf_counter() - t0) * 1e6)
            tails.append(0.0)
        n = len(times)
        if n >= MIN_RUNS:
            rse = statistics.stdev(times) / math.sqrt(n) / statistics.fmean(times)
            if rse < TARGET_RSE or time.perf_counter() - start_s > budget_s:
                break
    return Timed(times, tails, out, args, which)


# --- the evaluation -----------------------------------------------------------------------------------------------


def read_task(task_dir: str, only: list[str] | None) -> dict:
    with open(os.path.join(task_dir, "task.json")) as f:
        task = json.load(f)
    # Defaults mirror TaskSpec in ksearch_graph/task.py (this file may not import it).
    task.setdefault("reference", "reference.py")
    task.setdefault("solution_file", "kernel.py")
    task.setdefault("language", "triton")
    task.setdefault("correctness_seeds", 3)
    task["tolerance"] = {"atol": 1e-5, "rtol": 1e-5, "matched_ratio": 1.0} | task.get("tolerance", {})
    if only:
        unknown = sorted(set(only) - {w["name"] for w in task["workloads"]})
        if unknown:
            raise ValueError(f"--workloads names unknown workloads {unknown}")
        task["workloads"] = [w for w in task["workloads"] if w["name"] in only]
    return task


def environment() -> dict:
    env = {
        "device": DEVICE,
        "gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1",
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    return env


def evaluate(args, result: dict) -> None:
    """Fill ``result`` in place; raise Failure for a candidate that does not pass."""
    global DEVICE
    if torch.cuda.is_available():
        DEVICE = "cuda"
    else:
        os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton
        # CPU timings only order candidates, so make them steady: on a busy machine an OpenMP barrier waiting
        # for a descheduled worker thread adds a whole scheduler tick (~8 ms) to a 10 us torch call.
        torch.set_num_threads(1)
    result["environment"] = environment()
    result["timing_representative"] = DEVICE == "cuda" and not result["environment"]["triton_interpret"]

    task = read_task(args.task, args.workloads.split(",") if args.workloads else None)
    if task["language"] == "cuda" and DEVICE != "cuda":
        raise Failure("unavailable", "this task's candidates are CUDA code and this machine has no CUDA GPU")
    if args.seeds_from_env:
        base_seed = int(os.environ.pop(SEED_ENV))
    else:
        base_seed = secrets.randbits(62)
    budget_s = args.time_budget_s
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=DEVICE) if DEVICE == "cuda" else None

    def inputs_for(ref_module, workload) -> list:
        # Regenerated in each phase rather than kept: the input sets of a big task (MoE weights) do not fit on the
        # device for every workload at once.
        return [
            ref_module.make_inputs(workload["params"], derive_seed(base_seed, workload["name"], i), DEVICE)
            for i in range(task["correctness_seeds"])
        ]

    # 1. Reference outputs and timings, before the candidate exists in this process.
    try:
        ref = load_module("ksearch_reference", os.path.join(args.task, task["reference"]))
        expected, ref_us, ref_tail = {}, {}, {}
        for w in task["workloads"]:
            progress(f"reference {w['name']}")
            input_sets = inputs_for(ref, w)
            outs = [ref.reference(*clone(inputs)) for inputs in input_sets]
            expected[w["name"]] = [[to_host_bytes(t) for t in as_tensors(o)] for o in outs]
            for o in outs:
                scrub(o)
            timed = bench(ref.reference, input_sets, budget_s, flush)
            scrub(timed.out)
            ref_us[w["name"]] = statistics.fmean(timed.times)
            ref_tail[w["name"]] = statistics.median(timed.tails)  # the plain cost of noticing the device is idle
            del input_sets, outs, timed
    except Exception as e:
        raise Failure("runtime_error", "the task's reference failed (a task bug, not the candidate's):\n"
                      + describe(e, os.path.abspath(args.task))) from None

    # 2. Import the candidate.
    root = os.path.abspath(args.candidate)
    sys.path[0] = root  # was the harness's own folder; candidates may import their own helper modules
    t0 = time.perf_counter()
    path = os.path.join(root, task["solution_file"])
    if not os.path.isfile(path):
        raise Failure("compile_error", f"the candidate has no {task['solution_file']}")
    progress("import candidate")
    try:
        module = load_module(os.path.splitext(os.path.basename(path))[0], path)
    except BaseException as e:
        raise Failure("compile_error", describe(e, root)) from None
    fn = getattr(module, task["entry_point"], None)
    if not callable(fn):
        raise Failure("compile_error", f"{task['solution_file']} defines no function {task['entry_point']}")
    result["compile_s"] = time.perf_counter() - t0

    def call(inputs, where: str, first: bool = False):
        try:
            out = fn(*inputs)
            sync()  # asynchronous CUDA errors surface here, and belong to this call
            return out
        except BaseException as e:
            # Triton compiles on the first call; its compiler errors are compile errors, not crashes.
            compiled = first and type(e).__module__.startswith("triton.compiler")
            raise Failure("compile_error" if compiled else "runtime_error", f"{where}:\n{describe(e, root)}") from None

    def check(out, inputs, pristine, expected_out, where: str) -> float:
        if not same(inputs, pristine):
            raise Failure("suspicious", f"{where}: the candidate wrote into its input tensors")
        status, message, max_err = compare(out, expected_out, task["tolerance"])
        if status:
            raise Failure(status, f"{where}: {message}")
        return max_err

    # 3. Correctness on every workload first, so a failing candidate costs no timing.
    results = {}
    for w in task["workloads"]:
        name = w["name"]
        results[name] = {"workload": name, "correct": False}
        result["workloads"] = list(results.values())
        max_err = 0.0
        for i, pristine in enumerate(inputs_for(ref, w)):
            where = f"workload {name}, input set {i + 1}/{task['correctness_seeds']}"
            progress(f"correctness {where}")
            inputs = clone(pristine)
            t0 = time.perf_counter()
            out = call(inputs, where, first=i == 0)
            if i == 0:
                result["compile_s"] += time.perf_counter() - t0  # the first call carries the JIT compile
            max_err = max(max_err, check(out, inputs, pristine, expected[name][i], where))
            del out, inputs
        results[name].update(correct=True, max_abs_error=max_err)

    # 4. Timing, then a re-check of what the last timed call returned.
    notes = []
    for w in task["workloads"]:
        name = w["name"]
        where = f"workload {name}, timed call"
        progress(f"timing {name}")
        input_sets = inputs_for(ref, w)
        try:
            timed = bench(fn, input_sets, budget_s, flush)
        except BaseException as e:
            raise Failure("runtime_error", f"{where}:\n{describe(e, root)}") from None
        # A kernel may behave while checked and misbehave while timed.
        check(timed.out, timed.args, input_sets[timed.which], expected[name][timed.which],
              f"{where} (passed the correctness check)")
        times = timed.times
        # Cross-check: work left running on another stream finishes after the call's end event. When the device
        # stays busy clearly longer than after the reference's calls, that work counts as the call's.
        extra_us = statistics.median(timed.tails) - ref_tail[name]
        if extra_us > max(ESCAPE_SLACK_US, 0.2 * statistics.median(times)):
            times = [t + tail - ref_tail[name] for t, tail in zip(times, timed.tails)]
            notes.append(f"{name}: the device stayed busy {extra_us:.0f} us after the call ended on its stream "
                         "(work on another stream?); timed until the whole device was idle")
        mean = statistics.fmean(times)
        results[name].update(
            latency_us=mean,
            median_us=statistics.median(times),
            std_us=statistics.stdev(times),
            runs=len(times),
            reference_us=ref_us[name],
            speedup=ref_us[name] / mean,
        )

    speedups = [r["speedup"] for r in results.values()]
    result["status"] = "passed"
    result["score"] = geomean(speedups)
    result["latency_us"] = geomean([r["latency_us"] for r in results.values()])
    if result["timing_representative"]:
        notes += [f"{n}: speedup {r['speedup']:.1f}x is implausibly high, worth a second look"
                  for n, r in results.items() if r["speedup"] > 10]
    result["log_excerpt"] = "\n".join(notes)


def geomean(values: list[float]) -> float:
    if not values or any(v <= 0 for v in values):
        return 0.0
    return math.exp(sum(math.log(v) for v in values) / len(values))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", required=True, help="task folder (with task.json)")
    parser.add_argument("--candidate", required=True, help="folder with the candidate's files")
    parser.add_argument("--out", required=True, help="where to write the result JSON")
    parser.add_argument("--workloads", default="", help="comma-separated workload names (default: all)")
    parser.add_argument("--seeds-from-env", action="store_true", help=f"take the base input seed from ${SEED_ENV}")
    parser.add_argument("--time-budget-s", type=float, default=1.0,
                        help="timing budget per workload, for the candidate and the reference each")
    args = parser.parse_args(argv)
    faulthandler.enable()  # a segfault still prints where it happened, for the parent's log excerpt

    start = time.perf_counter()
    result = {"status": "runtime_error", "workloads": [], "score": 0.0, "latency_us": None, "compile_s": 0.0,
              "wall_s": 0.0, "log_excerpt": "", "timing_representative": False, "environment": {}}
    try:
        evaluate(args, result)
    except Failure as f:
        result["status"], result["log_excerpt"] = f.status, clip(f.message)
    except BaseException as e:  # a harness or task problem, or a candidate escaping the guarded calls
        result["log_excerpt"] = clip("evaluation failed: " + "".join(traceback.format_exception(e)))
    if result["status"] != "passed":
        result["score"] = 0.0
    result["wall_s"] = time.perf_counter() - start
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1)
    os.replace(tmp, args.out)  # the parent never sees a half-written file
    progress(f"done: {result['status']}")
    return 0


if __name__ == "__main__":
    code = main()
    # Skip interpreter teardown (torch and Triton take ~0.5 s to unload, and candidate destructors or atexit
    # hooks could still crash after the result is written).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
