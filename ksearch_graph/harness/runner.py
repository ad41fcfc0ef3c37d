"""The candidate's process: the only place where candidate code runs. Started and driven by ``judge.py`` over a
socket (the messages: ``protocol.py``).

    python ksearch_graph/harness/runner.py --fd FD --config JSON

Why a second process: the judge generates inputs from hidden seeds, computes the reference and compares, in a process
the candidate cannot reach. Nothing the candidate does here (patching torch, walking the garbage collector, reading
freed device memory, reading the environment) can see an expected output or a seed it has not been sent. A crash or a
CUDA error poisons only this process; the judge reports it and checks that the GPU still works.

What runs here, per message from the judge (see ``serve``): generate the inputs of one seed with the task's own
``make_inputs``, call the candidate on them (a correctness call or a warm-up) and send the output and the inputs
back through CUDA IPC / shared memory, so the judge compares on the device without copies; or time a burst of calls,
one per seed (``timing.timed_burst``), hold their outputs and inputs, and send those of the calls the judge then
picks. Before torch is imported the process leaves the network namespace (where Linux allows an unprivileged user
namespace); torch is imported lazily for that reason (``unshare`` refuses a process with threads).
"""

from __future__ import annotations

import hashlib
import os
import sys
import time

if __name__ == "__main__" and not __package__:  # started by path: import the package, not this folder's files
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    __package__ = "ksearch_graph.harness"  # noqa: A001

from . import forgery  # noqa: E402
from ._torch import load_torch  # noqa: E402  (no module here imports torch before load_torch)
from .guards import InterpreterHooks, LibraryPatches  # noqa: E402
from .isolation import die_with_parent, isolate_network  # noqa: E402
from .protocol import (Armed, Burst, Call, Drop, Error, Exit, Flags, Import, Loaded, Next, Output, Ping, Pong,  # noqa: E402
                       Ready, Send, Timed, Warm, Warmed)
from .reporting import Failure, Reported, clip, describe, progress  # noqa: E402
from .tasks import load_module, prepare  # noqa: E402
from .tensors import fingerprint, key_skeleton, snapshot, without_added_keys  # noqa: E402
from .timer import Timer  # noqa: E402
from .timing import timed_burst  # noqa: E402


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
        from .build_errors import build_error_excerpt
        raise Failure("compile_error", clip(build_error_excerpt(str(e)) or str(e))) from None
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
    def __init__(self, conn, cfg: dict, reference_module, make_inputs, entry, timer: Timer, patches: LibraryPatches,
                 guards: forgery.Guards | None = None):
        """``make_inputs``: the task's, bound before the candidate was imported (it could replace the module's)."""
        self.conn, self.cfg, self.timer, self.patches, self.guards = conn, cfg, timer, patches, guards
        self.device, self.root = cfg["device"], cfg["candidate"]
        self.make_inputs = make_inputs
        self.entry = entry
        # The last burst's (output, inputs, key_skeleton) per timed call, until the judge has checked what it chose.
        self.held = []
        self.reference_calls = 0
        original = reference_module.reference

        def counted(*a, **k):  # calling the task's reference is allowed, but the result says so
            self.reference_calls += 1
            return original(*a, **k)

        reference_module.reference = counted

    def flags(self, patches: bool = True) -> Flags:
        """What the judge checks after each call and burst; ``patches``: look for replaced library functions too
        (LibraryPatches, ~0.7 ms), not needed when an output already checked is sent again."""
        hooks = list(self.timer.hooks.found) if self.timer.hooks is not None and self.timer.hooks.found else None
        replaced = self.patches.found() if patches else []
        persisting = None
        runtime = self.timer.runtime
        if runtime is not None:
            now = runtime.persisting_l2_bytes()
            if now is not None and now != runtime.default_persisting_l2:
                persisting = now
        return Flags(reference_calls=self.reference_calls, power_limited=self.timer.power_limited,
                     heat_s=self.timer.spent_s["heat"], fill_s=self.timer.spent_s["fill"], interpreter_hooks=hooks,
                     library_patches=replaced or None, persisting_l2_bytes=persisting,
                     **(self.guards.flags() if self.guards is not None else {}))

    def forged(self) -> Error | None:
        """The failure the guards' findings make (forgery.py), for a failure that may come from a blocked reach for
        the harness (audit.py raises into the candidate's code)."""
        return self.guards.error() if self.guards is not None else None

    def serve(self) -> None:
        # Inference, as the judge calls the reference: a module's parameters would otherwise make every call record
        # an autograd graph the reference never pays for.
        load_torch().set_grad_enabled(False)
        while True:
            msg = self.conn.recv()
            match msg:
                case Exit():
                    return
                case Drop():
                    self.held = []
                case Send(index):  # one of the last burst's calls, chosen by the judge after the burst
                    out, inputs, skeleton = self.held[index]
                    inputs, flags = self.sent_inputs(inputs, skeleton, self.flags(patches=False))
                    self.conn.send(Output(out, inputs, None, 0.0, flags))
                case Burst():
                    self.burst(msg)
                case Call() | Warm():
                    self.call(msg)

    @staticmethod
    def sent_inputs(inputs, skeleton, flags: Flags) -> tuple:
        """(inputs as sent to the judge, flags): dict keys the candidate added taken off and named in the flags."""
        added = []
        inputs = without_added_keys(inputs, skeleton, added)
        return inputs, flags._replace(added_input_keys=added) if added else flags

    def inputs(self, workload: str, params: dict, seed: int) -> tuple:
        """(inputs, fn, args) of one seed; a failure here is the task's make_inputs failing in this process."""
        try:
            inputs = self.make_inputs(params, seed, self.device)
            return (inputs, *prepare(self.entry, inputs, self.cfg["kind"], self.device))
        except BaseException as e:
            self.conn.send(Error("runtime_error", f"workload {workload}: generating its inputs failed:\n"
                                 + describe(e, self.root)))
            raise Reported from None

    def burst(self, msg: Burst) -> None:
        """``count`` timed calls, each on its own inputs; outputs and inputs held for the judge's checks, and each
        output's fingerprint sent now: an output changed after its call (a thread, say) is caught.

        Each call's seed is asked of the judge only when the call is next: had this process the whole burst's seeds,
        a candidate could find them (and ``make_inputs``) in its memory and compute later calls' outputs in the heat
        or in an earlier call (tests/cheats/future_seeds.py)."""
        workload, params, count, heat_seed, first = msg
        self.held = []
        progress(f"time {workload} x{count}")
        kept = []

        def next_call(k: int) -> tuple:
            self.conn.send(Next(k))
            inputs, fn, args = self.inputs(workload, params, self.conn.recv().seed)
            kept.append((inputs, key_skeleton(inputs)))
            return fn, args

        try:
            heat_inputs, fn, args = self.inputs(workload, params, heat_seed)
            self.timer.untimed_us = []
            self.timer.heat(fn, args, first)
            prints = []  # taken at once: a thread of the candidate's could change a copy that waits for its check
            done = timed_burst(self.timer, count, next_call, lambda out: prints.append(fingerprint(out)),
                               filler=(fn, args), held=heat_inputs)
            del heat_inputs, fn, args
        except Reported:
            raise
        except BaseException as e:  # the candidate's, SystemExit included
            self.conn.send(self.forged() or Error("runtime_error", describe(e, self.root)))
            raise Reported from None
        self.held = [(out, inputs, skeleton) for (out, *_), (inputs, skeleton) in zip(done, kept)]
        untimed = sorted(self.timer.untimed_us)
        self.conn.send(Timed([times for _, *times in done], prints, self.flags(),
                             untimed[len(untimed) // 2] if untimed else None))

    def call(self, msg: Call | Warm) -> None:
        workload, params, seed, first = msg
        warm = isinstance(msg, Warm)
        self.held = []
        inputs, fn, args = self.inputs(workload, params, seed)
        before = None if warm else fingerprint(inputs)
        skeleton = key_skeleton(inputs)
        progress(f"{'warm' if warm else 'call'} {workload}")
        try:
            t0 = self.timer.perf()
            out = fn(*args)
            if self.timer.hooks is not None:
                self.timer.hooks.disarm()
            self.timer.sync()  # asynchronous CUDA errors surface here, and belong to this call
            seconds = self.timer.perf() - t0
            if warm:
                self.conn.send(Warmed(seconds))
                return
            inputs, flags = self.sent_inputs(inputs, skeleton, self.flags())
            self.conn.send(Output(snapshot(out, self.timer.sync), inputs, before, seconds, flags))
        except BaseException as e:
            status = "compile_error" if first and is_compiler_error(e) else "runtime_error"
            self.conn.send(self.forged() or Error(status, describe(e, self.root)))
            raise Reported from None  # after a CUDA error this process is unusable; the judge is done anyway


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
    die_with_parent(cfg["judge_pid"])
    network = isolate_network() if cfg["isolate_network"] else "no (disabled)"
    from multiprocessing.connection import Connection

    conn = Connection(args.fd)
    # Shared-memory tensors travel as file descriptors through multiprocessing's resource sharer, which
    # authenticates with the process authkey: use the judge's.
    import multiprocessing

    multiprocessing.current_process().authkey = bytes.fromhex(cfg["authkey"])
    # Its listener socket lives in a temp dir; a long TMPDIR exceeds AF_UNIX's 107-byte path limit.
    multiprocessing.process.current_process()._config["tempdir"] = cfg["socket_dir"]
    try:
        torch = load_torch()  # torch does not import triton, so TRITON_INTERPRET can still be set below
        if cfg["device"] == "auto":
            cfg["device"] = "cuda" if torch.cuda.is_available() else "cpu"
        if cfg["device"] == "cpu":
            os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton
            torch.set_num_threads(1)  # CPU timings only order candidates; keep them steady
        timer = Timer(cfg["device"])
    except BaseException as e:
        conn.send(start_failure(e, cfg))
        return
    # No candidate code has run yet. The judge may now time the reference on an otherwise idle device (and may even
    # be waiting for its job: it can start us ahead of time). It says "import", with the task's details, when done;
    # only then does candidate code run (its import could leave work running on the GPU).
    conn.send(Loaded({"network_isolated": network, "device": cfg["device"],
                      "host_spin_wait": bool(timer.runtime and timer.runtime.spin_wait),
                      "launch_cover": timer.cover_kind}))
    msg = conn.recv()
    while isinstance(msg, Ping):  # the judge's round trip, for its own bound on the timings (time_bound.py)
        conn.send(Pong())
        msg = conn.recv()
    if not isinstance(msg, Import):
        return
    cfg.update(msg.task)
    timer.use_timing(cfg.get("timing", "device"))
    guards = None
    try:
        reference_module = load_module("ksearch_task_inputs", cfg["reference"])
        sys.path[0] = cfg["candidate"]  # was the package's folder; candidates may import their own helper modules
        progress("import candidate")
        timer.hooks = InterpreterHooks()  # what the process has before the candidate's code first runs
        patches = LibraryPatches(reference_module)
        make_inputs = reference_module.make_inputs
        guards = forgery.arm(cfg["candidate"], timer, {  # integrity.py's snapshot and audit.py's hook
            "the interpreter hooks": (timer.hooks, ()), "the power gauge": (timer.gauge, ()),
            "the CUDA runtime": (timer.runtime, ()), "the launch cover": (timer.cover, ()),
            "the library patches": (patches, ()), "the connection": (conn, ())})
        conn.send(Armed(guards.check_us()))  # sent before any candidate code runs: the judge can trust it
        t0 = time.perf_counter()
        entry = load_candidate(cfg)
        compile_s = time.perf_counter() - t0
        if guards.error():  # what the candidate's import did
            raise Failure("suspicious", "")
    except Failure as f:
        conn.send((guards and guards.error()) or Error(f.status, f.message))
        return
    except BaseException as e:
        conn.send(start_failure(e, cfg))
        return
    conn.send(Ready(compile_s))
    try:
        runner = Runner(conn, cfg, reference_module, make_inputs, entry, timer, patches, guards)
        guards.watch("the runner", runner, ("held", "reference_calls"))
        runner.serve()
    except Reported:
        pass


if __name__ == "__main__":
    try:
        main()
    finally:
        # Skip interpreter teardown: candidate destructors or atexit hooks could still crash or hang.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
