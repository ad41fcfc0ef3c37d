"""The candidate's process: the only place where candidate code runs. Started by ``judge.py`` inside the OS sandbox
(``sandbox.py``) and driven over one socket (the messages: ``wire.py``).

    python ksearch_graph/harness/candidate/runner.py --fd FD --config JSON

The judge trusts nothing this process says: it makes every input itself and lends it here in memory it owns
(``lending.py``), reads every output out of the slot it lent into its own memory, and bounds every timing by its
own clock and, on CPU, by the kernel's count of this process tree's CPU time (``time_bound.py``). What runs here is
the honest side of that protocol: rebuild the lent inputs, call the candidate, time the call with events (on a GPU)
behind the launch cover, write the output into the slot. The in-process guards (audit hook, integrity snapshot,
interpreter hooks, library patches) are a first filter that names the cheat it saw; the judge does not rely on them.

Messages, in order: ``Begin`` (torch is imported; make the device's context and the timer, say ``Loaded``), ``Import`` (the task's reference files and the
candidate's entry: the reference module is loaded, the judge may then ask for ``Calibrate`` bursts, which time a
function that does no work, then ``Load`` imports the candidate), then ``Lend`` / ``Call`` / ``Warm`` / ``Burst``
in any order, ``Exit``.
"""

from __future__ import annotations

import faulthandler
import hashlib
import os
import socket
import sys
import time

if __name__ == "__main__" and not __package__:  # started by path: import the package, not this folder's files
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    __package__ = "ksearch_graph.harness.candidate"  # noqa: A001

# Every harness module this process uses is imported here, before the integrity snapshot: one imported later (on a
# build's failure, say) would be a new attribute of its package, which the check takes for a changed harness.
from ksearch_graph.harness._torch import load_torch  # noqa: E402  (no module here imports torch before load_torch)
from ksearch_graph.harness.candidate import build_errors, forgery  # noqa: E402
from ksearch_graph.harness.guards import InterpreterHooks, LibraryPatches  # noqa: E402
from ksearch_graph.harness.isolation import die_with_parent, isolate_network  # noqa: E402
from ksearch_graph.harness.job import REFERENCE_IN_RUNNER  # noqa: E402
from ksearch_graph.harness.lending import put_output, rebuild  # noqa: E402
from ksearch_graph.harness.modules import load_module  # noqa: E402
from ksearch_graph.harness.policy import POLICY  # noqa: E402
from ksearch_graph.harness.reporting import Failure, Reported, clip, describe, progress  # noqa: E402
from ksearch_graph.harness.shared_memory import Region  # noqa: E402
from ksearch_graph.harness.spin_cores import pin  # noqa: E402
from ksearch_graph.harness.tasks import prepare  # noqa: E402
from ksearch_graph.harness.timer import Timer  # noqa: E402
from ksearch_graph.harness.timing import timed_burst  # noqa: E402
from ksearch_graph.harness.wire import (  # noqa: E402
    FLAG_FIELDS,  # noqa: E402
    Begin,
    Burst,
    Calibrate,
    Call,
    Channel,
    Done,
    Error,
    Exit,
    Go,
    Import,
    Imported,
    Lend,
    Load,
    Loaded,
    Output,
    Prepared,
    Ready,
    Stage,
    Staged,
    Taken,
    Timed,
    Warm,
    Warmed,
)

_PERF = time.perf_counter  # bound before any candidate code runs


def build_torch_extension(root: str, cache: str, entry_point: str):
    """Build the candidate's CUDA C++ (kernel.cu, main.cpp, ...) as a torch extension, cached by source hash."""
    from torch.utils import cpp_extension

    names = sorted(n for n in os.listdir(root) if n.endswith((".cu", ".cpp", ".cc", ".h", ".cuh", ".hpp")))
    sources = [os.path.join(root, n) for n in names if n.endswith((".cu", ".cpp", ".cc"))]
    if not sources:
        raise Failure("compile_error", "a CUDA candidate needs kernel.cu and main.cpp (found no .cu/.cpp file)")
    digest = hashlib.sha256()
    for n in names:
        with open(os.path.join(root, n), "rb") as f:
            digest.update(n.encode() + b"\0" + f.read() + b"\0")
    name = "ksearch_ext_" + digest.hexdigest()[:16]
    build = os.path.join(cache, "torch-extensions", name)
    # Build from copies inside the cache folder: torch rebuilds when the source paths or include paths change, and
    # every evaluation's candidate folder is a new temporary one.
    src = os.path.join(build, "src")
    os.makedirs(src, exist_ok=True)
    for n in names:  # untouched when present: ninja rebuilds whatever has a newer timestamp
        if not os.path.exists(os.path.join(src, n)):
            with open(os.path.join(root, n), "rb") as f, open(os.path.join(src, n), "wb") as g:
                g.write(f.read())
    sources = [os.path.join(src, os.path.basename(p)) for p in sources]
    try:
        module = cpp_extension.load(name=name, sources=sources, extra_include_paths=[src], build_directory=build,
                                    extra_cuda_cflags=["-O3", "--use_fast_math"], verbose=False)
    except Exception as e:  # the compiler's own output is in the message; keep its first errors and their source
        raise Failure("compile_error", clip(build_errors.build_error_excerpt(str(e)) or str(e))) from None
    fn = getattr(module, entry_point, None)
    if fn is None:
        raise Failure("compile_error", f"the extension built, but main.cpp binds no function {entry_point}")
    return fn


def load_candidate(cfg: dict):
    """Import (or build) the candidate; what this costs is its compile time."""
    root = cfg["candidate"]
    if cfg["form"] == "torch_extension":
        return build_torch_extension(root, cfg["cache"], cfg["entry_point"])
    path = os.path.join(root, cfg["solution_file"])
    if not os.path.isfile(path):
        raise Failure("compile_error", f"the candidate has no {cfg['solution_file']}")
    try:
        module = load_module(os.path.splitext(os.path.basename(path))[0], path)
    except BaseException as e:
        raise Failure("compile_error", describe(e, root)) from None
    fn = getattr(module, cfg["entry_point"], None)
    if not callable(fn):
        raise Failure("compile_error", f"{cfg['solution_file']} defines no {cfg['entry_point']}")
    return fn


def is_compiler_error(exc: BaseException) -> bool:
    """Triton and CuPy compile on the first call; their compiler errors are compile errors, not crashes."""
    return any(type(e).__module__.startswith(("triton.compiler", "cupy.cuda.compiler")) for e in _chain(exc))


def _chain(exc):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


class Runner:
    """The candidate's process after start-up: the judge's requests, one at a time (``serve``)."""

    def __init__(self, channel: Channel, cfg: dict, timer: Timer):
        self.channel, self.cfg, self.timer = channel, cfg, timer
        self.device, self.root = cfg["device"], cfg["candidate"]
        self.slot: Region | None = None  # the judge's output slot (Lend)
        self.reference_module = None
        self.entry = None  # the candidate's entry point, once imported (Load)
        self.patches: LibraryPatches | None = None
        self.guards: forgery.Guards | None = None
        self.reference_calls = 0

    # -- messages --------------------------------------------------------------------------------------------------

    def send(self, msg: tuple) -> None:
        self.channel.send(msg)

    def receive(self) -> tuple[tuple, list[int]]:
        return self.channel.receive_from_judge()

    def serve(self) -> None:
        while True:
            msg, fds = self.receive()
            match msg:
                case Exit():
                    return
                case Import():
                    self.prepare_task(msg.task)
                case Calibrate():
                    self.calibrate(msg)
                case Load():
                    self.load()
                case Lend():
                    if self.slot is not None:
                        self.slot.close()
                    self.slot = Region.take(fds[0], msg.nbytes, self.device)
                case Burst():
                    self.burst(msg, fds)
                case Call() | Warm():
                    self.call(msg, fds)

    def flags(self, patches: bool = True) -> dict:
        """The in-process guards' findings (wire.FLAG_FIELDS), sent with every output and burst."""
        hooks = list(self.timer.hooks.found) if self.timer.hooks is not None and self.timer.hooks.found else None
        replaced = self.patches.found() if patches and self.patches is not None else []
        persisting = None
        runtime = self.timer.runtime
        if runtime is not None:
            now = runtime.persisting_l2_bytes()
            if now is not None and now != runtime.default_persisting_l2:
                persisting = now
        found = {"reference_calls": self.reference_calls, "power_limited": self.timer.power_limited,
                 "heat_s": self.timer.spent_s["heat"], "fill_s": self.timer.spent_s["fill"],
                 "interpreter_hooks": hooks, "library_patches": replaced or None, "persisting_l2_bytes": persisting,
                 "harness_changed": None, "introspection": None}
        if self.guards is not None:
            found.update(self.guards.flags())
        return {k: found[k] for k in FLAG_FIELDS}

    def forged(self) -> Error | None:
        """The failure the guards' findings make (forgery.py), for a failure that may come from a blocked reach for
        the harness (audit.py raises into the candidate's code)."""
        return self.guards.error() if self.guards is not None else None

    # -- start-up: the task, the calibration, the candidate --------------------------------------------------------

    def prepare_task(self, task: dict) -> None:
        """The task's reference files, written to this process's private folder and loaded (the reference's
        module: candidates may call it, and module-kind tasks build their model through it)."""
        self.cfg.update({k: v for k, v in task.items() if k != "reference_files"})
        self.timer.use_timing(self.cfg.get("timing", "device"))
        folder = os.path.join(os.environ.get("TMPDIR", "/tmp"), "ksearch-task")
        os.makedirs(folder, exist_ok=True)
        for name, text in task["reference_files"].items():
            path = os.path.normpath(os.path.join(folder, name))
            if not path.startswith(folder + os.sep):
                continue
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        sys.path.insert(0, folder)
        try:
            self.reference_module = load_module("ksearch_task_reference", os.path.join(folder, task["reference"]))
        except BaseException as e:
            self.send(Error("runtime_error", f"{REFERENCE_IN_RUNNER} (a task bug, not the candidate's):\n"
                            + describe(e, folder)))
            raise Reported from None
        original = self.reference_module.reference

        def counted(*a, **k):  # calling the task's reference is allowed, but the result says so
            self.reference_calls += 1
            return original(*a, **k)

        self.reference_module.reference = counted
        self.arm()
        self.send(Prepared())

    def calibrate(self, msg: Calibrate) -> None:
        """Timed calls of a function that does no work but return empty tensors of the expected output, made
        exactly as the candidate's will be (before any candidate code exists): what the judge's clock sees around a
        call besides the call itself (time_bound.py)."""
        torch = load_torch()
        shapes = [(tuple(shape), getattr(torch, dtype)) for shape, dtype in msg.outputs]
        device = self.device

        def nothing(*args):
            outs = tuple(torch.empty(shape, dtype=dtype, device=device) for shape, dtype in shapes)
            return outs if len(outs) > 1 else outs[0]

        self.timed_calls(msg.count, entry=self.reference_module.reference, stand_in=nothing)
        self.send(Timed(self.flags(), None))

    def arm(self) -> None:
        """The in-process guards, armed once the task is loaded and before the calibration, so that the calibration's
        calls pay what the candidate's will (the audit hook, the interpreter-hook checks)."""
        self.timer.hooks = InterpreterHooks()  # what the process has before the candidate's code first runs
        self.patches = LibraryPatches(self.reference_module)
        self.guards = forgery.arm(self.root, self.timer, {  # integrity.py's snapshot and audit.py's hook
            "the interpreter hooks": (self.timer.hooks, ()), "the power gauge": (self.timer.gauge, ()),
            "the CUDA runtime": (self.timer.runtime, ()), "the launch cover": (self.timer.cover, ()),
            "the library patches": (self.patches, ()), "the channel": (self.channel, ()),
            "the runner": (self, ("slot", "reference_calls", "entry", "guards"))})

    def load(self) -> None:
        """Import (or build) the candidate: its compile time."""
        try:
            progress("import candidate")
            t0 = time.perf_counter()
            sys.path[0] = self.root  # candidates may import their own helper modules
            self.entry = load_candidate(self.cfg)
            compile_s = time.perf_counter() - t0
            if self.guards.error():  # what the candidate's import did
                raise Failure("suspicious", "")
        except Failure as f:
            self.send(self.forged() or Error(f.status, f.message))
            raise Reported from None
        except BaseException as e:
            self.send(self.forged() or start_failure(e, self.cfg))
            raise Reported from None
        self.send(Imported(compile_s))

    # -- calls ------------------------------------------------------------------------------------------------------

    def lent(self, tree: list, regions: list, fds: list[int]) -> tuple:
        """(inputs, regions) of the judge's lent inputs: the regions are this process's mappings, closed by the
        caller once the call is over (inputs are valid during their call only)."""
        taken = [Region.take(fd, nbytes, "cuda" if device == "cuda" else "cpu")
                 for (device, nbytes), fd in zip(regions, fds)]
        return rebuild(tree, taken), taken

    def call(self, msg: Call | Warm, fds: list[int]) -> None:
        warm = isinstance(msg, Warm)
        inputs, regions = self.lent(msg.inputs, msg.regions, fds)
        progress(f"{'warm' if warm else 'call'} {msg.workload}")
        try:
            fn, args = prepare(self.entry, inputs, self.cfg["kind"], self.device)
            t0 = self.timer.perf()
            out = fn(*args)
            if self.timer.hooks is not None:
                self.timer.hooks.disarm()
            self.timer.sync()  # asynchronous CUDA errors surface here, and belong to this call
            seconds = self.timer.perf() - t0
            if warm:
                self.send(Warmed(seconds))
            else:
                output = put_output(self.slot, out, self.timer.sync)
                self.send(Output(output, seconds, self.flags()))
        except BaseException as e:
            status = "compile_error" if not warm and msg.first and is_compiler_error(e) else "runtime_error"
            self.send(self.forged() or Error(status, describe(e, self.root)))
            raise Reported from None  # after a CUDA error this process is unusable; the judge is done anyway
        finally:
            inputs = fn = args = out = None  # noqa: F841
            for r in regions:
                r.close()

    def burst(self, msg: Burst, fds: list[int]) -> None:
        """A heat on the lent heat inputs, then ``count`` timed calls, each on inputs the judge lends when this
        process says it is ready (``Ready``, ``Stage``, ``Staged``, ``Go``); each output goes into the slot, and the next call waits until
        the judge has taken it (``Taken``)."""
        progress(f"time {msg.workload} x{msg.count}")
        heat_inputs, heat_regions = self.lent(msg.heat, msg.regions, fds)
        try:
            try:
                fn, args = prepare(self.entry, heat_inputs, self.cfg["kind"], self.device)
                self.timer.untimed_us = []
                self.timer.heat(fn, args, msg.first)
            except BaseException as e:  # the candidate's, SystemExit included
                self.send(self.forged() or Error("runtime_error", describe(e, self.root)))
                raise Reported from None
            self.timed_calls(msg.count, entry=self.entry, filler=(fn, args), held=heat_inputs)
            del fn, args
        finally:
            heat_inputs = None
            for r in heat_regions:
                r.close()
        untimed = sorted(self.timer.untimed_us)
        self.send(Timed(self.flags(), untimed[len(untimed) // 2] if untimed else None))

    def timed_calls(self, count: int, entry, filler=None, held=None, stand_in=None) -> None:
        """``count`` timed calls through ``timing.timed_burst``; ``stand_in``: call it instead of the entry (a
        calibration: the entry only builds the arguments)."""
        regions: list[Region] = []
        # When this process had its Go, by the clock bound at this module's import: the timer's may be the candidate's
        # by now, and the figure is only the timing trace's (kept within the wire's range).
        went = [0.0]

        def next_call(k: int) -> tuple:
            self.send(Ready(k))
            stage, fds = self.receive()
            if not isinstance(stage, Stage) or stage.index != k:
                raise Reported  # the judge gave up on this burst (it says why itself)
            inputs, taken = self.lent(stage.inputs, stage.regions, fds)  # mapped before the judge's clock runs
            regions.extend(taken)
            self.send(Staged(k))
            if self.device == "cuda" and POLICY.spin_wait_s:  # the judge's clock runs from before its Go
                self.channel.spin(POLICY.spin_wait_s)
            go, _ = self.receive()
            went[0] = _PERF()
            if not isinstance(go, Go) or go.index != k:
                raise Reported
            fn, args = prepare(entry, inputs, self.cfg["kind"], self.device)  # a module's state is read here
            return (stand_in, args) if stand_in is not None else (fn, args)

        def deliver(k: int, out, times: list[float]) -> None:
            output = put_output(self.slot, out, self.timer.sync)
            self.send(Done(k, [*times, min(max((_PERF() - went[0]) * 1e6, 0.0), 1e9)], output))
            taken, _ = self.receive()
            if not isinstance(taken, Taken) or taken.index != k:
                raise Reported
            while regions:  # unmapped once the judge's clock stopped: a GPU unmap synchronizes the device
                regions.pop().close()

        try:
            timed_burst(self.timer, count, next_call, deliver, filler=filler, held=held)
        except Reported:
            raise
        except BaseException as e:  # the candidate's, SystemExit included
            self.send(self.forged() or Error("runtime_error", describe(e, self.root)))
            raise Reported from None
        finally:
            while regions:
                regions.pop().close()


def start_failure(exc: BaseException, cfg: dict) -> Error:
    return Error("runtime_error", "the candidate's process failed to start:\n" + describe(exc, cfg["candidate"]))


def main() -> None:
    import argparse
    import json

    p = argparse.ArgumentParser()
    p.add_argument("--fd", type=int, required=True)
    p.add_argument("--config", required=True)
    args = p.parse_args()
    cfg = json.loads(args.config)
    faulthandler.enable()  # a crash in the candidate's native code leaves its Python stack in the log
    if cfg.get("sandboxed"):  # bubblewrap ties us to the judge and gave us no network
        network = "yes (sandbox)"
    else:
        die_with_parent(cfg["judge_pid"])
        network = isolate_network() if cfg["isolate_network"] else "no (disabled)"
    channel = Channel(socket.socket(fileno=args.fd))
    try:
        torch = load_torch()  # torch does not import triton, so TRITON_INTERPRET can still be set below
        # The device is touched only once the judge holds it for this (its Begin): a context made while another
        # evaluation is timed on the same GPU would slow that one down.
        msg, _ = channel.receive_from_judge()
        if not isinstance(msg, Begin):
            return
        if cfg["device"] == "auto":
            cfg["device"] = "cuda" if torch.cuda.is_available() else "cpu"
        if cfg["device"] == "cuda" and cfg.get("cores"):
            pin(cfg["cores"])  # off the judge's core while both poll (spin_cores.py)
        if cfg["device"] == "cpu":
            os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton
            torch.set_num_threads(1)  # CPU timings only order candidates; keep them steady
        timer = Timer(cfg["device"])
    except (EOFError, ConnectionError):
        return
    except BaseException as e:
        channel.send(start_failure(e, cfg))
        return
    # No candidate code has run yet. The judge may now time the reference on an otherwise idle device (and may even
    # be waiting for its job: it can start us ahead of time).
    channel.send(Loaded({"network_isolated": network, "device": cfg["device"],
                         "host_spin_wait": bool(timer.runtime and timer.runtime.spin_wait),
                         "launch_cover": timer.cover_kind}))
    # Inference, as the judge calls the reference: a module's parameters would otherwise make every call record an
    # autograd graph the reference never pays for.
    torch.set_grad_enabled(False)
    try:
        Runner(channel, cfg, timer).serve()
    except (Reported, EOFError, ConnectionError):
        pass


if __name__ == "__main__":
    try:
        main()
    finally:
        # Skip interpreter teardown: candidate destructors or atexit hooks could still crash or hang.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
