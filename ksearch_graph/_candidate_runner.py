"""The candidate's process: the only place where candidate code runs. Started and driven by ``_evaluate_child.py``
(the judge) over a socket; also the home of what both processes share (the timed call, tensor helpers).

    python _candidate_runner.py --fd FD --config JSON

Why a second process: the judge generates inputs from hidden seeds, computes the reference and compares, in a process
the candidate cannot reach. Nothing the candidate does here (patching torch, walking the garbage collector, reading
freed device memory, reading the environment) can see an expected output or a seed it has not been sent. A crash or a
CUDA error poisons only this process; the judge reports it and checks that the GPU still works.

What runs here, per message from the judge (see ``serve``): generate the inputs of one seed with the task's own
``make_inputs``, call the candidate on them (a correctness call or a warm-up) and send the output and the inputs
back through CUDA IPC / shared memory, so the judge compares on the device without copies; or time a burst of calls,
one per seed (``timed_burst``), hold their outputs and inputs, and send those of the calls the judge then picks. Before torch is
imported the process leaves the network namespace (where Linux allows an unprivileged user namespace); torch is
imported lazily for that reason (``unshare`` refuses a process with threads).
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import gc
import hashlib
import importlib.util
import math
import os
import signal
import sys
import time
import types
import traceback

torch = None  # imported by load_torch(), after the network namespace is gone
_CLONE = _DETACH = _TENSOR = _NO_TORCH_FUNCTION = None  # what snapshot uses, bound by load_torch()

MIN_RUNS, MAX_RUNS = 3, 100
MIN_RUNS_GPU = 10  # three steady samples can all come from one clock state (seen on the H200: 157 vs 133 us)
# Timed calls are measured as under sustained load, the state ``triton.testing.do_bench`` and a serving loop measure
# in. A kernel that drives an H200 past its 700 W limit runs at lower clocks under its own load (an 8192^3 bf16
# matmul: 1.44 ms for the first 50 ms, 1.59-1.63 ms from 150 ms on, SM clock 1500 MHz instead of 1980; a 4096^3:
# 178 us, then 185-190 us at 1740-1815 MHz), and recovers within ~50 ms of lighter work (BENCHMARKS.md, sessions 5
# and 8). Before a workload's first burst of timed calls, the candidate's own calls run back to back on other inputs
# (a heat, HEAT_WINDOW_S at a time, until a window is no slower than the one before). The kernel is power-limited
# when NVML's instantaneous power, read while they run and refreshed within the heat, is at POWER_LIMITED of the
# enforced limit or more (PowerGauge; the clock and its reasons only where the driver has no power reading), or
# when the calls slowed down near the cap (LOAD_SLOWDOWN, SLOWDOWN_POWER). A heat that finds no limit goes on
# until such a power reading exists (NVML refreshes it about every 100 ms on an H200: the second refresh,
# 100-250 ms in); a limited one lasts at least HEAT_MIN_S (FIRST_HEAT_MIN_S for a process's first, from a possibly
# cool GPU), and between timed calls more untimed calls keep the candidate's calls at FILL_DUTY of the time (input
# generation, checks and copies fill the rest, and draw less power), at most FILL_MAX x the timed call's time.
# Other kernels run at top clocks either way and get neither. A later burst of a workload gets HEAT_S, or HEAT_MIN_S
# where it is power-limited: the GPU idled through the judge's checks since the last burst and is back at its top
# clock, and 20 ms of calls do not bring it down again (session 14, H200, two bursts 50 ms apart: a 4096^3 bf16 matmul's
# second burst read 2.9% faster than its first after 20 ms of heat, 0.3% after 200 ms; an 8192^3 1.9% and 0.1%).
HEAT_S, HEAT_WINDOW_S, HEAT_MIN_S, FIRST_HEAT_MIN_S, HEAT_MAX_S = 0.02, 0.025, 0.2, 0.3, 0.5
UNLIMITED_HEAT_WINDOWS = 2, 4  # windows before a heat may call a kernel not power-limited (later, process's first)
CLOCK_LIMITED = 0.97
# 0.95: a 3072^3 bf16 matmul at 640-664 W (0.92-0.95) kept its top clock on an H200; a 4096^3 at 700-759 W
# did not. Calling a kernel limited that is not costs fillers (time), never accuracy; the other way round it reads
# fast.
POWER_LIMITED = 0.95
# Calls that slow down under their own load by more than LOAD_SLOWDOWN (the last heat window against the fastest
# after the first) are limited too, when NVML read at least SLOWDOWN_POWER of the limit during the heat (or has no
# power reading): the cap cannot hold a GPU far below it, and a few-us kernel's window means move by 3% without
# it (session 10: a 64K-element multiply at 358 W of 700 and the softmax example were called limited).
LOAD_SLOWDOWN, SLOWDOWN_POWER = 0.03, 0.8
# An 8192^3 bf16 matmul on an H200 with a 2 ms gap between timed calls, against do_bench (session 9):
# 0.85 / 8: -8.4%, 0.92 / 16: -3.3%, 0.97 / 32: +0.5%, at 0.60, 0.86 and 1.37 s for 20 calls. A 4096^3 read
# -5.5 to -6.8% at all three (do_bench's own figure moves by 2-3% between calls).
FILL_DUTY = 0.92
FILL_MAX = 16.0
# A host that has waited (on the judge's pipe, or asleep) or made inputs on the CPU takes 130-230 us to launch the next
# call instead of ~40 (an H200 host, session 7), and the device idles between the start event and the call's kernels
# meanwhile: a 32 us matmul read 96-190 us. So before each timed call a kernel that flushes the L2 and then holds
# every SM until COVER_S after it started runs on the timed stream, and the host launches the call behind it
# (_launch_cover.py, which also says why it fills every SM). Back-to-back use hides launches the same way.
COVER_S = 0.5e-3
UNTIMED_RATIO = 0.5  # untimed calls faster than this share of the timed ones: the candidate tells them apart (a cache)
TARGET_RSE = 0.01  # stop timing once the relative standard error of the mean is below 1%
# A power-limited kernel's calls vary more (an 8192^3 bf16 matmul: 2% per call, its clock moving under the cap), and
# 10 calls left three evaluations 2.5% apart on an H200 (session 9): half the error, for ~4x the calls. Judged on
# burst means (precise_enough), the power-limited matmuls of the calibration rarely reach it: they time until the
# budget is spent (4 bursts of a 4096^3 in 1 s).
TARGET_RSE_LIMITED = 0.005
LIMITED_MIN_BURSTS = 3  # bursts for a power-limited workload, where they fit in the budget (see precise_enough)
FLUSH_BYTES = 256 << 20  # at least 2x the L2 of any current GPU (H200: 50 MB)
SMALL_BLOCK_BYTES = 1 << 20  # torch's caching allocator serves requests up to 1 MB from its small pool (2 MB segments)
LOG_LIMIT = 2000
PROGRESS = "[ksearch-eval] "


def load_torch():
    global torch, _CLONE, _DETACH, _TENSOR, _NO_TORCH_FUNCTION
    if torch is None:
        import torch as _torch
        import torch.multiprocessing  # noqa: F401  (registers the IPC reductions on ForkingPickler)

        torch = _torch
        # What copies outputs (snapshot), bound before any candidate code runs: a candidate that replaces
        # torch.Tensor.clone could finish its output inside the copy (tests/cheats/patch_clone.py).
        _CLONE, _DETACH, _TENSOR = torch.Tensor.clone, torch.Tensor.detach, torch.Tensor
        _NO_TORCH_FUNCTION = torch._C.DisableTorchFunction
    return torch


class Reported(Exception):
    """A failure already sent to the judge: the process only has to end."""


class Failure(Exception):
    """Ends the evaluation with ``status``; ``message`` becomes the log excerpt the LLM sees."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def progress(msg: str) -> None:
    # The parent shows the last of these lines when it has to kill us, so a hang says where it hung.
    print(PROGRESS + msg, file=sys.stderr, flush=True)


def clip(text: str, limit: int = LOG_LIMIT) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def describe(exc: BaseException, root: str) -> str:
    """The exception message plus the last frames of the candidate's own code, not the whole traceback."""
    frames, chain, seen = [], exc, set()
    while chain is not None and id(chain) not in seen:  # Triton's interpreter re-raises `from` the original error
        seen.add(id(chain))
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


def derive_seed(base: int, *parts) -> int:
    digest = hashlib.sha256(":".join(str(p) for p in (base, *parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


# --- tensors and nested values (tuples, lists and dicts of tensors and plain values) ----------------------------


def clone(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(clone(v) for v in value)
    if isinstance(value, dict):
        return type(value)((k, clone(v)) for k, v in value.items())
    return copy.deepcopy(value)


def as_tensors(value) -> list | None:
    """A tensor or a tuple/list of tensors as a list; None for anything else."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, torch.Tensor) for v in value):
        return list(value)
    return None


def fingerprint(value) -> list:
    """A content checksum computed on the device: per tensor its shape, its dtype, and ``checksum``; bit-exact (NaNs
    and -0.0 included), so equal contents give equal fingerprints in both processes.

    The sums stay on the device until the end: one wait for the device per fingerprint, not one per tensor.
    """
    out, sums = [], []
    for t in _leaves(value):
        if isinstance(t, torch.Tensor):
            sums.append((len(out), checksum(t)))
            out.append((tuple(t.shape), str(t.dtype)))
        else:
            out.append(repr(t))
    for i, acc in sums:
        out[i] = (*out[i], *acc.tolist())
    return out


CHECKSUM_CHUNK = 1 << 26  # int32 words summed per int64 copy (512 MB): MoE weights are 7.5 GB
SUMMABLE = ("torch.float16", "torch.bfloat16", "torch.float32", "torch.float64")  # value sums (not float8)


def checksum(t):
    """Three sums as one int64 tensor: the tensor's bytes read as int32 words summed exactly (in int64, a chunk at
    a time), its last ``nbytes % 4`` bytes, and the bits of the float64 sum of its values where it has summable
    floating values (NaN-safe), else 0. The word sum sees any single changed bit; sign flips, which change their
    words by +-2**31 and so can cancel in pairs (a negated tensor with as many negative values as positive ones), change
    the value sum. Order-blind, as any sum: swapped elements go unseen.

    Two reads of the tensor and an int64 copy, against a float64 copy, nan_to_num, abs and two sums before: on an
    H200 the word sum alone took 2.2 ms for TriMul's 1.6 GB outputs where the old sums took 6.7 ms, which a
    power-limited workload paid again 11x over in fillers (session 9)."""
    t = t.detach().resolve_conj().resolve_neg()
    raw = t.contiguous().reshape(-1).view(torch.uint8)
    whole = raw.numel() - raw.numel() % 4
    try:
        words = raw[:whole].view(torch.int32)
    except RuntimeError:  # a view whose storage offset is not a multiple of 4 bytes
        words = raw[:whole].clone().view(torch.int32)
    sums = torch.zeros(3, dtype=torch.int64, device=t.device)
    for lo in range(0, words.numel(), CHECKSUM_CHUNK):
        sums[0] += words[lo:lo + CHECKSUM_CHUNK].sum(dtype=torch.int64)
    sums[1] = raw[whole:].sum(dtype=torch.int64)
    values = torch.view_as_real(t) if t.is_complex() else t
    if str(values.dtype) in SUMMABLE and values.numel():
        total = values.sum(dtype=torch.float32 if values.element_size() < 4 else None)
        sums[2] = torch.nan_to_num(total.to(torch.float64), nan=7.0, posinf=11.0, neginf=-13.0).view(torch.int64)
    return sums


def _leaves(value):
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from _leaves(v)
    elif isinstance(value, dict):
        for k in value:
            yield from _leaves(value[k])
    else:
        yield value


def prepare(entry, inputs: tuple, kind: str, device: str):
    """(callable, arguments) for one call. ``module`` kind: inputs are (init_args, state_dict, *forward_inputs)."""
    if kind == "function":
        return entry, inputs
    init_args, state, *forward = inputs
    model = entry(*init_args).to(device)
    model.load_state_dict(state, strict=True)
    return model, tuple(forward)


# --- timing -------------------------------------------------------------------------------------------------------


class CudaRuntime:
    """The few CUDA runtime calls torch does not expose, through the libcudart torch already loaded."""

    LIMIT_PERSISTING_L2 = 0x06  # cudaLimitPersistingL2CacheSize

    def __init__(self):
        self.lib = None
        self.default_persisting_l2 = 0
        try:
            with open("/proc/self/maps") as f:
                paths = {line.split()[-1] for line in f if "libcudart.so" in line}
            for path in sorted(paths) or ["libcudart.so"]:
                self.lib = ctypes.CDLL(path)
                break
        except OSError:
            self.lib = None
        # Spin while waiting for the device, set before the context exists: a host thread that yields can wake up
        # tens of us late, and the escape check compares wake-ups (seen on the H200 with the default: an honest
        # matmul read 39 us of escaped work in one of 15 workload evaluations).
        self.spin_wait = self.lib is not None and self.lib.cudaSetDeviceFlags(1) == 0  # cudaDeviceScheduleSpin
        # The device's own setting (nonzero on an H200 here), read before any candidate code runs.
        self.default_persisting_l2 = self.persisting_l2_bytes() or 0

    def pci_bus_id(self) -> bytes | None:
        """The current device's PCI bus id ("0000:3B:00.0"), which NVML knows it by (its indices ignore
        CUDA_VISIBLE_DEVICES)."""
        if self.lib is None:
            return None
        buf, device = ctypes.create_string_buffer(64), ctypes.c_int(0)
        if self.lib.cudaGetDevice(ctypes.byref(device)) != 0 or self.lib.cudaDeviceGetPCIBusId(buf, 64, device) != 0:
            return None
        return buf.value

    def persisting_l2_bytes(self) -> int | None:
        if self.lib is None:
            return None
        value = ctypes.c_size_t(0)
        if self.lib.cudaDeviceGetLimit(ctypes.byref(value), self.LIMIT_PERSISTING_L2) != 0:
            return None
        return value.value

    def reset_persisting_l2(self) -> None:
        """Evict persisting lines (a flush cannot: it is what they survive) and restore the device's carve-out."""
        if self.lib is not None:
            self.lib.cudaCtxResetPersistingL2Cache()
            self.lib.cudaDeviceSetLimit(self.LIMIT_PERSISTING_L2, ctypes.c_size_t(self.default_persisting_l2))


class NvmlValue(ctypes.Union):
    """nvmlValue_t (nvml.h); ``NvmlField.valueType`` says which member NVML wrote (the order of KINDS)."""
    KINDS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
    _fields_ = [("dVal", ctypes.c_double), ("uiVal", ctypes.c_uint), ("ulVal", ctypes.c_ulong),
                ("ullVal", ctypes.c_ulonglong), ("sllVal", ctypes.c_longlong), ("siVal", ctypes.c_int),
                ("usVal", ctypes.c_ushort)]


class NvmlField(ctypes.Structure):
    """nvmlFieldValue_t (nvml.h): one value of nvmlDeviceGetFieldValues. Its timestamp is when the value was asked
    for, not when the driver measured it (session 8: the instantaneous power's always read 0 ms old)."""
    _fields_ = [("fieldId", ctypes.c_uint), ("scopeId", ctypes.c_uint), ("timestamp", ctypes.c_longlong),
                ("latencyUsec", ctypes.c_longlong), ("valueType", ctypes.c_int), ("nvmlReturn", ctypes.c_int),
                ("value", NvmlValue)]

    def number(self) -> float | None:
        if self.nvmlReturn != 0 or not 0 <= self.valueType < len(NvmlValue.KINDS):
            return None
        return float(getattr(self.value, NvmlValue.KINDS[self.valueType]))


class PowerGauge:
    """What NVML (the driver's libnvidia-ml, loaded by ctypes) says about the GPU's power limit: ``read()`` gives
    whether the clock is held now (the SM clock below CLOCK_LIMITED of its top clock, or a clock-event reason that
    says the power cap or a slowdown holds it: THROTTLED) and the instantaneous power; ``at_limit`` compares the
    power with the enforced limit (POWER_LIMITED). ``Timer.heat`` decides which reading counts.

    The power reading is what tells early: on an H200 (session 8) an 8192^3 bf16 matmul back to back read 792-872 W
    of 700 while the clock was still at or near top; the cap then pulled the clock to 1500 MHz and the calls from
    1.40-1.44 ms to 1.59-1.63 ms. A 3072^3 matmul read 640-664 W and kept its top clock; a 4096^3 read 700-759 W and
    went to 1740-1875 MHz. The clock and its reasons lag: they still read the cap after the load had gone.
    """

    SM, POWER_INSTANT = 1, 186  # NVML_CLOCK_SM, NVML_FI_DEV_POWER_INSTANT (mW)
    THROTTLED = 0x4 | 0x8 | 0x20 | 0x40 | 0x80  # SW power cap, HW slowdown, SW/HW thermal, HW power brake

    def __init__(self, pci_bus_id: bytes | None):
        self.lib = self.handle = self.reasons = self.field_values = None
        self.top = self.limit_mw = 0
        self.has_power = False  # the driver has the instantaneous power field (r535 on) and an enforced limit
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            handle, top, limit = ctypes.c_void_p(), ctypes.c_uint(0), ctypes.c_uint(0)
            if pci_bus_id and lib.nvmlInit_v2() == 0 \
                    and lib.nvmlDeviceGetHandleByPciBusId_v2(pci_bus_id, ctypes.byref(handle)) == 0 \
                    and lib.nvmlDeviceGetMaxClockInfo(handle, self.SM, ctypes.byref(top)) == 0 and top.value:
                self.lib, self.handle, self.top = lib, handle, top.value
                if lib.nvmlDeviceGetEnforcedPowerLimit(handle, ctypes.byref(limit)) == 0:
                    self.limit_mw = limit.value
                # Renamed from ...ThrottleReasons in driver 535; either reads the same bits.
                self.reasons = getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
                    lib, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
                self.field_values = getattr(lib, "nvmlDeviceGetFieldValues", None)
                self.has_power = self.power() is not None
        except (OSError, AttributeError):
            pass

    @property
    def available(self) -> bool:
        return self.lib is not None

    def power(self) -> float | None:
        """Instantaneous power in W; None where the driver has no such field or no enforced limit to compare it
        with, or the query failed. NVML refreshes it about every 100 ms on an H200, and its timestamp is the
        query's (NvmlField): a fresh reading is one that changed."""
        field = NvmlField(fieldId=self.POWER_INSTANT)
        if not self.limit_mw or self.field_values is None \
                or self.field_values(self.handle, 1, ctypes.byref(field)) != 0:
            return None
        mw = field.number()
        return None if mw is None else mw / 1e3

    def read(self) -> tuple[bool, float | None]:
        """(whether the clock is held now: below CLOCK_LIMITED of its top, or a THROTTLED reason; ``power()``)."""
        now, reasons = ctypes.c_uint(0), ctypes.c_ulonglong(0)
        held = self.lib.nvmlDeviceGetClockInfo(self.handle, self.SM, ctypes.byref(now)) == 0 \
            and now.value < CLOCK_LIMITED * self.top
        held = held or (self.reasons is not None and self.reasons(self.handle, ctypes.byref(reasons)) == 0
                        and bool(reasons.value & self.THROTTLED))
        return held, self.power()

    def at_limit(self, watts: float, share: float = POWER_LIMITED) -> bool:
        return watts * 1e3 >= share * self.limit_mw


def launch_cover(flush) -> tuple:
    """(cover, what it is): the Triton kernel of _launch_cover.py; where Triton cannot build it, a one-thread spin
    and the flush, which cover the launch as well but let work on other streams run beside them (the result's
    environment says which ran)."""
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        cover = load_module("_ksearch_launch_cover", os.path.join(here, "_launch_cover.py"))
        return cover.LaunchCover(flush, COVER_S), "every SM held"
    except Exception as e:  # noqa: BLE001 - any failure to build it leaves the weaker cover, reported
        spin, zero_, cycles = torch.cuda._sleep, torch.Tensor.zero_, int(COVER_S * 2e9)

        def cover():
            spin(cycles)
            zero_(flush)

        progress(f"launch cover: Triton kernel unavailable ({type(e).__name__}: {e}); a one-thread spin instead")
        return cover, f"one-thread spin ({type(e).__name__})"


class InterpreterHooks:
    """Ways Python runs a candidate's code between its call's return and the copy of its output with no call of the
    candidate's in sight ("lazy results computed later", EVALUATION.md): a profile or trace function (also one set
    from C), a sys.monitoring tool, a garbage-collector callback, a signal handler, torch function or dispatch modes,
    dynamo's frame callback, a Python kernel registered for an aten operator (the copy's clone). No kernel needs
    one, so ``disarm``, right after each of the candidate's calls and before its end event (what a hook does before
    is timed), names what was added since the candidate was imported, and resets what it can; the judge fails the
    candidate as suspicious. Bound here, before any candidate code is imported.

    A thread of the candidate's can install a hook after ``disarm`` (this thread releases the GIL while it waits for
    the device), so ``recheck`` looks again once the output is copied: a hook that was there then is found. Not
    covered (BENCHMARKS.md, session 11): such a hook that removes itself before ``recheck``, and kernels registered
    for aten operators from C++. The fix for the whole class is a copy queued on the device right behind the end
    event, made without torch's dispatcher; it changes the escape check, so it waits for a GPU run."""

    def __init__(self):
        import _signal  # signal.getsignal is Python code a candidate can patch; this is the C function

        self.getprofile, self.setprofile, self.gettrace, self.settrace = (sys.getprofile, sys.setprofile,
                                                                          sys.gettrace, sys.settrace)
        self.profile, self.trace = sys.getprofile(), sys.gettrace()
        self.callbacks = gc.callbacks  # the collector's own list (rebinding gc.callbacks does not replace it)
        self.callbacks_before = list(self.callbacks)
        self.monitoring = getattr(sys, "monitoring", None)  # Python 3.12+
        self.monitored_before = self._monitored()
        self.getsignal = _signal.getsignal
        self.signals = [s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)]
        self.handlers_before = [self.getsignal(s) for s in self.signals]
        self.function_modes = torch._C._len_torch_function_stack
        self.dispatch_modes = torch._C._len_torch_dispatch_stack
        self.modes_before = (self.function_modes(), self.dispatch_modes())
        try:
            from torch._C._dynamo import eval_frame
            self.get_frame_callback, self.set_frame_callback = (eval_frame.get_eval_frame_callback,
                                                                eval_frame.set_eval_frame)
        except (ImportError, AttributeError):
            self.get_frame_callback = self.set_frame_callback = None
        self.frame_callback = self.get_frame_callback() if self.get_frame_callback else None
        library = importlib.import_module("torch.library")
        self.library_impls = getattr(library, "_impls", set())  # "namespace/op/dispatch key" from Python
        self.impls_seen = set(self.library_impls)  # torch registers more itself (torch.compile: ~200, Meta mostly)
        self.found: list[str] = []

    def _monitored(self) -> list:
        """Per sys.monitoring tool: its name and its global events (a freed tool's events stay live)."""
        if self.monitoring is None:
            return []
        return [(self.monitoring.get_tool(t), self.monitoring.get_events(t)) for t in range(6)]

    def disarm(self) -> None:
        found = []
        if self.getprofile() is not self.profile or self.gettrace() is not self.trace:
            found.append("a profile or trace function (sys.setprofile / sys.settrace)")
        # Always reset: one set from C (PyEval_SetProfile) is invisible to sys.getprofile.
        self.setprofile(self.profile)
        self.settrace(self.trace)
        if self._monitored() != self.monitored_before:
            found.append("a sys.monitoring tool")
        if self.callbacks != self.callbacks_before:
            self.callbacks[:] = self.callbacks_before
            found.append("a garbage-collector callback (gc.callbacks)")
        # Compared by identity: a handler's __eq__ is the candidate's. Left in place: the default action of a
        # signal the candidate armed may be to end the process before the judge hears why.
        found += [f"a handler for signal {s}" for s, before in zip(self.signals, self.handlers_before)
                  if self.getsignal(s) is not before]
        if (self.function_modes(), self.dispatch_modes()) != self.modes_before:
            found.append("a torch function or dispatch mode left entered")
        if self.get_frame_callback is not None and self.get_frame_callback() is not self.frame_callback:
            self.set_frame_callback(self.frame_callback)
            found.append("a frame evaluation callback (torch._C._dynamo.eval_frame.set_eval_frame)")
        if len(self.library_impls) != len(self.impls_seen):
            added = set(self.library_impls) - self.impls_seen
            self.impls_seen |= added
            if any(_copies_output(key) for key in added):
                found.append("a Python kernel for an operator that copies tensors (torch.library)")
        self.found += [f for f in found if f not in self.found]

    def recheck(self, collecting: bool) -> None:
        """``disarm`` again after the output's copy; ``collecting``: the garbage collector was on before the copy,
        which only a thread of the candidate's does while this thread waits (the collector is off from the call on;
        its callbacks could have finished the output inside the copy)."""
        if collecting and "the garbage collector turned on while the harness waited" not in self.found:
            self.found.append("the garbage collector turned on while the harness waited")
        self.disarm()


class LibraryPatches:
    """The functions of torch and Triton that the harness's own steps go through, as they were before the candidate
    was imported ("monkey-patching the timer", EVALUATION.md). A candidate that replaced one runs its code where its
    inputs already exist and no timer runs: torch.randn inside the task's ``make_inputs``, torch.cuda.Event.__new__
    or torch.cuda.current_stream (which Event.record looks up) before the start event, Triton's launcher before the
    launch cover; it could compute its output there (tests/cheats/patch_inputs.py, patch_stream.py). No kernel needs
    to, so ``found()`` names what was replaced and the judge fails the candidate as suspicious.

    Watched by identity, and a Python function also by its code, defaults and closure (swapping ``__code__`` keeps
    the identity): modules' functions and classes, and the module's own type; classes through their whole MRO, with
    any name added that hides a base class's or is a dunder (``__getattribute__``); objects (Triton's driver): every
    attribute set. A watched name deleted counts too (a module ``__getattr__`` could answer for it). Lazily added
    submodules are not replacements, nor is torch's own wrapper of ``torch.manual_seed`` that importing torch._dynamo
    makes (its ``__wrapped__`` and only function in its closure is the original)."""

    def __init__(self, task_module: types.ModuleType | None = None):
        """``task_module``: the task's reference.py, whose ``make_inputs`` runs here; its functions, classes and
        modules (its ``torch`` too) are watched, but ``reference``, which the runner wraps to count the candidate's
        calls of it."""
        import torch.backends.cuda
        import torch.nn.functional as F

        spaces = [("torch", torch), ("torch.nn.functional", F), ("torch.random", torch.random),
                  ("torch.cuda", torch.cuda), ("torch.backends.cuda", torch.backends.cuda),
                  ("torch.Tensor", torch.Tensor), ("torch.cuda.Event", torch.cuda.Event),
                  ("torch.cuda.Stream", torch.cuda.Stream)]
        triton = sys.modules.get("triton.runtime.driver")  # imported by the launch cover, on CUDA
        if triton is not None:
            jit, compiler = sys.modules.get("triton.runtime.jit"), sys.modules.get("triton.compiler.compiler")
            spaces += [("triton.runtime.driver", triton), ("triton driver config", triton.driver)]
            active = getattr(triton.driver, "_active", None)
            if active is not None:
                spaces += [("triton's active driver", active), ("triton's active driver", type(active))]
            spaces += [(f"{m.__name__}.{c}", getattr(m, c)) for m, names in (
                (jit, ("JITFunction", "KernelInterface")), (compiler, ("CompiledKernel",))) if m is not None
                for c in names if hasattr(m, c)]
        # (label, namespace dict (live), {name: (value, its code state) before}, names before, names of its bases)
        self.kept = []
        self.modules = [(label, space, type(space)) for label, space in spaces if isinstance(space, types.ModuleType)]
        for label, space in spaces:
            if isinstance(space, type):
                mro = space.__mro__[:-1]  # object's own slots are not ours to watch
                for i, klass in enumerate(mro):
                    self.kept.append((f"{label} ({klass.__name__})" if klass is not space else label, vars(klass),
                                      self._state(vars(klass), lambda v: callable(v) or hasattr(v, "__func__")),
                                      set(vars(klass)), set().union(*(vars(base) for base in mro[i + 1:]))))
            elif isinstance(space, types.ModuleType):
                self.kept.append((label, vars(space), self._state(
                    vars(space), lambda v: callable(v) and not isinstance(v, types.ModuleType)), None, None))
            else:  # an attribute still None (not made yet) is not watched: Triton fills some in lazily
                self.kept.append((label, vars(space), self._state(vars(space), lambda v: v is not None), None, None))
        if task_module is not None:
            # Functions, classes and modules only: a task may keep data (a cache, a counter) in its globals.
            state = self._state(vars(task_module), lambda v: callable(v) or isinstance(v, types.ModuleType))
            state.pop("reference", None)
            self.kept.append(("the task's reference.py", vars(task_module), state, None, None))

    @staticmethod
    def _code(value) -> tuple | None:
        """What a Python function runs, which can change while the function stays the same object."""
        fn = getattr(value, "__func__", value)  # classmethod, staticmethod
        if not isinstance(fn, types.FunctionType):
            return None
        return fn.__code__, fn.__defaults__, fn.__kwdefaults__, tuple(map(id, _cells(fn)))

    def _state(self, namespace, watched) -> dict:
        return {k: (v, self._code(v)) for k, v in namespace.items() if watched(v)}

    @staticmethod
    def _torch_wrapper(value, before) -> bool:
        """torch._dynamo's wrapper of one of torch's functions (torch/_compile.py), around the original alone."""
        if not isinstance(value, types.FunctionType) or getattr(value, "__wrapped__", None) is not before:
            return False
        inside = [c for c in _cells(value) if callable(c)]
        return inside == [before] and value.__code__.co_filename.endswith(os.path.join("torch", "_compile.py"))

    def found(self) -> list[str]:
        out = [f"{label} (its type)" for label, module, kind in self.modules if type(module) is not kind]
        for label, now, before, names, hidden in self.kept:
            for name, (value, code) in before.items():
                if name not in now:
                    out.append(f"{label}.{name} (deleted)")
                    continue
                current = now[name]
                if current is value:
                    if code is not None and self._code(current) != code:
                        out.append(f"{label}.{name} (its code)")
                elif not self._torch_wrapper(current, value):
                    out.append(f"{label}.{name}")
            if names is not None:
                out += [f"{label}.{name}" for name in now.keys() - names
                        if name in hidden or (name.startswith("__") and name.endswith("__"))]
        return out


def _cells(fn: types.FunctionType) -> list:
    """What a function's closure holds (an empty cell, not yet assigned, as None)."""
    out = []
    for cell in fn.__closure__ or ():
        try:
            out.append(cell.cell_contents)
        except ValueError:
            out.append(None)
    return out


# The aten operators a copy of an output goes through (snapshot: detach, clone; clone: empty_like, empty_strided or
# empty, copy_).
_COPY_OPS = {"alias", "clone", "copy_", "detach", "empty", "empty_like", "empty_strided", "_to_copy"}


def _copies_output(library_key: str) -> bool:
    """A torch.library registration ("namespace/op.overload/dispatch key") that would run inside the copy; Meta
    kernels only compute shapes (torch.compile registers some for these operators itself)."""
    namespace, op, key = (library_key.split("/") + ["", "", ""])[:3]
    return namespace == "aten" and op.split(".")[0] in _COPY_OPS and key != "Meta"


class Timer:
    """One timed call, done the same way for the reference (in the judge) and the candidate (here).

    On CUDA: L2 flushed by writing 256 MB, events around the call on the current stream, then a device-wide
    synchronize and a third event: the gap between the call's end event and the device going idle is work the call
    left running elsewhere (a side stream, a thread). The functions used are bound here, before any candidate code is
    imported, so a candidate that patches ``torch.cuda.Event.elapsed_time`` or ``synchronize`` patches copies we do
    not call.
    """

    def __init__(self, device: str):
        self.cuda = device == "cuda"
        self.perf = time.perf_counter
        # Python's garbage collector stays off through each timed call (see time); bound here like the CUDA calls.
        self.gc_disable, self.gc_enable, self.gc_isenabled = gc.disable, gc.enable, gc.isenabled
        self.hooks: InterpreterHooks | None = None  # the candidate's process sets one (see InterpreterHooks)
        self.zero_ = torch.Tensor.zero_
        self.empty, self.uint8 = torch.empty, torch.uint8
        self.output_small_sizes: list[int] = []  # bytes of the small tensors of the last untimed call's output
        self.untimed_us: list[float] = []  # device times of heat and filler calls, for the caller's consistency check
        self.heated = False  # the first heat of this process may start from a cool GPU
        self.limited = True  # the current workload drives the GPU to its power limit (see heat)
        # Why the last first heat called it limited ("power", "clock", "slowdown", "no power reading", "no NVML";
        # None: not limited), and its windows as (mean call us, clock held, W or None): diagnostics show them.
        self.limited_by: str | None = None
        self.heat_trace: list[tuple[float, bool | None, float | None]] = []
        self.spent_s = {"heat": 0.0, "fill": 0.0}  # wall time of heats and fillers, for the evaluation's breakdown
        self.gauge = None  # PowerGauge on CUDA
        if self.cuda:
            self.runtime = CudaRuntime()  # first: it sets how the host waits, before the context exists
            self.flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device)
            # No Python of torch's between these and the C calls: torch.cuda.Event() runs the class's __new__,
            # Event.record looks torch.cuda.current_stream up when called, torch.cuda.synchronize torch.cuda.device,
            # all after the inputs exist and before the start event. Code a candidate put there could compute its
            # output untimed (tests/cheats/patch_stream.py; LibraryPatches names such replacements too).
            event_new, stream_new = torch.cuda.Event.__new__, torch.cuda.Stream.__new__
            Event, Stream, get_stream = torch.cuda.Event, torch.cuda.Stream, torch._C._cuda_getCurrentStream
            record, device_index = torch.cuda.Event.record, torch.cuda.current_device()

            def current_stream():
                stream_id, index, kind = get_stream(device_index)
                return stream_new(Stream, stream_id=stream_id, device_index=index, device_type=kind)

            self.Event = lambda enable_timing=True: event_new(Event, enable_timing=enable_timing)
            self.record = lambda event: record(event, current_stream())
            self.elapsed = torch.cuda.Event.elapsed_time
            self.event_sync = torch.cuda.Event.synchronize
            self.sync = torch._C._cuda_synchronize  # device-wide
            self.gauge = PowerGauge(self.runtime.pci_bus_id())
            self.cover, self.cover_kind = launch_cover(self.flush)
        else:
            self.sync = lambda: None
            self.flush = None
            self.runtime = None
            self.cover, self.cover_kind = None, "none (CPU)"

    def time(self, fn, args) -> tuple:
        """(output, device us, tail us, probe us, host us) of one call, behind the launch cover, which flushes the L2
        (256 MB written) and then holds the GPU (see COVER_S).

        Tail: how long the device stayed busy after the call's end event, as this process sees it; probe: how long it
        takes this process, right now, to see an idle device (the shorter of two probes just before the call). Tail
        minus probe is work the call left on another stream. Both figures come from this process at this moment, so
        host speed mostly cancels out; a tail measured elsewhere (the reference's, in the judge) differed by tens of
        us between processes on the H200. Measured on the H200: 31 us of side-stream work behind a 1.3 us call read
        31-32 us here. A probe taken after busy work of its own read it 15-30 us short (host wake-up after a wait
        differs from this idle one), so the probe stays idle, and the host spins instead of yielding while it waits
        (see CudaRuntime), which keeps wake-ups short. A single probe by a host that had just waited read ~11 us
        long (session 7); the second of two is warmer.
        """
        # A collection of a process that has imported torch takes up to ~1 ms. Within a timed call it fell between
        # the launch cover and the call's launch (a 32 us matmul read 101-191 us, its host 570-730 us past the
        # cover) or between the synchronize and the idle event (a tail the escape check charged: an honest 32 us
        # matmul read 64 us in 2 of 3 evaluations on an H200, session 11). The collector runs between calls instead.
        with self.collector_off():
            return self._time(fn, args)

    def time_and_copy(self, fn, args) -> tuple:
        """``time``, then the output's ``snapshot``, with the collector off from the first to the last: a collection
        between them would run the candidate's gc.callbacks, which could finish the output, untimed, before the
        copy (InterpreterHooks names them too)."""
        with self.collector_off():
            out, *times = self._time(fn, args)
            collecting = self.gc_isenabled()
            self.gc_disable()
            copied = snapshot(out, self.sync)
            if self.hooks is not None:  # a thread of the candidate's may have installed one while this one waited
                self.hooks.recheck(collecting)
            return (copied, *times)

    @contextlib.contextmanager
    def collector_off(self):
        collecting = self.gc_isenabled()
        self.gc_disable()
        try:
            yield
        finally:
            if collecting:
                self.gc_enable()

    def _time(self, fn, args) -> tuple:
        if not self.cuda:
            t0 = self.perf()
            out = fn(*args)
            self.gc_disable()  # the candidate may have turned it on (see time_and_copy)
            if self.hooks is not None:
                self.hooks.disarm()
            us = (self.perf() - t0) * 1e6
            return out, us, 0.0, 0.0, us
        if self.runtime is not None:
            self.runtime.reset_persisting_l2()
        probe = min(self.idle_gap_us(), self.idle_gap_us())
        start, end, idle = self.Event(enable_timing=True), self.Event(enable_timing=True), self.Event(enable_timing=True)
        self.cover()  # flushes the L2, then holds the GPU while the call is launched (see COVER_S)
        h0 = self.perf()
        self.record(start)
        out = fn(*args)
        self.gc_disable()  # the candidate may have turned it on (see time_and_copy)
        if self.hooks is not None:  # first: what a hook does before this is timed (see InterpreterHooks)
            self.hooks.disarm()
        self.record(end)
        self.sync()  # waits for every stream of the device
        h1 = self.perf()
        self.record(idle)
        self.event_sync(idle)
        return out, self.elapsed(start, end) * 1e3, self.elapsed(end, idle) * 1e3, probe, (h1 - h0) * 1e6

    def back_to_back(self, fn, args, seconds: float, min_calls: int = 1, while_busy=None) -> None:
        """Untimed calls as ``do_bench`` makes them: flush, call, flush, call, ... with no synchronize between, so the
        GPU stays as busy as under sustained load; each call's device time goes to ``untimed_us``. At most two calls
        run ahead of the host, so the load ends soon after ``seconds``. ``while_busy()``, if given, runs while the
        last of them still do."""
        if not self.cuda:
            return
        pairs, until = [], self.perf() + seconds
        while len(pairs) < min_calls or self.perf() < until:
            start, end = self.Event(enable_timing=True), self.Event(enable_timing=True)
            self.zero_(self.flush)
            self.record(start)
            out = fn(*args)
            self.record(end)
            if not pairs:  # for reserve_small_blocks
                self.output_small_sizes = small_block_sizes(output_items(out))
            del out
            pairs.append((start, end))
            if len(pairs) > 2:
                self.event_sync(pairs[-3][1])
        if while_busy is not None:
            while_busy()
        self.sync()
        self.untimed_us += [self.elapsed(a, b) * 1e3 for a, b in pairs]

    @property
    def power_limited(self) -> bool:
        """Whether the current workload's first heat found the GPU at its power limit (never on CPU)."""
        return bool(self.cuda and self.limited)

    def heat(self, fn, args, first: bool) -> None:
        """The candidate's own calls back to back before a burst of timed calls; before a workload's ``first`` burst,
        until a window of them is no slower than the one before, and long enough for a power-limited kernel to
        settle (see HEAT_MIN_S); that heat also says whether this workload is power-limited."""
        t0 = self.perf()
        try:
            self._heat(fn, args, first)
        finally:
            self.spent_s["heat"] += self.perf() - t0

    def _heat(self, fn, args, first: bool) -> None:
        if not first:
            self.back_to_back(fn, args, later_heat_s(self.limited), min_calls=2)
            return
        least = (FIRST_HEAT_MIN_S, UNLIMITED_HEAT_WINDOWS[1]) if not self.heated else (
            HEAT_MIN_S, UNLIMITED_HEAT_WINDOWS[0])
        gauge = self.gauge if self.gauge is not None and self.gauge.available else None
        windows, started = [], self.perf()
        seen = gauge is None  # without NVML: limited (the safe side), no reading to wait for
        # A power reading counts from the second time it changed since the heat began. NVML refreshes it about every
        # 100 ms (H200), and the first refresh can cover time before the heat (the idle or the previous workload):
        # a 4096^3 bf16 matmul read 490 W at its first refresh, 717 W at its second (session 8). The clock and its
        # reasons lag the load they react to (an H200 still read the power cap 50 ms into a light workload's heat
        # after an 8192^3 matmul's timing), so they count only where the driver has no power reading.
        changes, last = 0, gauge.read()[1] if gauge is not None else None
        self.heated, self.heat_trace, why = True, [], "no NVML" if gauge is None else None
        peak = 0.0  # the highest power reading that counts (W)
        while self.cuda and self.perf() - started < HEAT_MAX_S:
            done, now = len(self.untimed_us), []
            # NVML is read while calls still run: a GPU idle for a moment reads top clock again (session 7: an
            # 8192^3 bf16 matmul at 1.39 ms against do_bench's 1.63 read as not limited after a synchronize).
            self.back_to_back(fn, args, HEAT_WINDOW_S, while_busy=None if gauge is None else lambda: now.append(
                gauge.read()))
            windows.append(sum(self.untimed_us[done:]) / max(1, len(self.untimed_us) - done))
            held, watts = now[-1] if now else (None, None)
            self.heat_trace.append((windows[-1], held, watts))
            if now:
                if not gauge.has_power:  # the clock, from the second window (in the first it may ramp up)
                    why = why or ("clock" if held and len(windows) > 1 else None)
                    seen = seen or len(windows) > 1
                elif watts is not None and watts != last:  # None: this query failed
                    changes, last = changes + 1, watts
                    if changes >= 2:
                        why, seen, peak = why or ("power" if gauge.at_limit(watts) else None), True, max(peak, watts)
            near_cap = gauge is not None and (not gauge.has_power or gauge.at_limit(peak, SLOWDOWN_POWER))
            if near_cap and len(windows) > 1 and windows[-1] > min(windows[1:]) * (1 + LOAD_SLOWDOWN):
                why = why or "slowdown"
            limited = why is not None
            settled = self.perf() - started >= least[0] if limited else seen and len(windows) >= least[1]
            if settled and len(windows) > 1 and windows[-1] <= windows[-2] * 1.01:
                break
        if not seen:  # no fresh power reading within HEAT_MAX_S: the safe side
            progress(f"heat: no NVML power reading refreshed within {HEAT_MAX_S:g} s; counted as power-limited")
            why = why or "no power reading"
        self.limited, self.limited_by = why is not None, why

    def fill(self, fn, args, gap_s: float, call_us: float) -> None:
        """Between two timed calls of a power-limited workload, before the next one's inputs exist: enough untimed
        calls that calls fill FILL_DUTY of the time, given the ``gap_s`` of other work around the last timed call
        (of ``call_us``)."""
        seconds = min(FILL_DUTY / (1 - FILL_DUTY) * gap_s - call_us * 1e-6, FILL_MAX * call_us * 1e-6)
        if self.limited and seconds > 0:
            t0 = self.perf()
            self.back_to_back(fn, args, seconds)
            self.spent_s["fill"] += self.perf() - t0

    def reserve_small_blocks(self, held, count: int) -> None:
        """Before a burst of ``count`` calls, each holding what ``held`` (one call's inputs as kept) holds, right after
        its heat: make and free the small blocks the burst will hold (each call's inputs and output copy, and two
        outputs), so no timed call's own allocation needs a new segment from the driver. The output's sizes are
        those of the first call of the last untimed run (``back_to_back``: the heat's last window).

        Why (session 12, H200): the burst holds every call's inputs and output copy for the judge's checks, so the
        caching allocator ran out of cached small blocks about once a burst, and the candidate's output allocation
        inside that timed call was a cudaMalloc, which waits for the launch cover: a 32 us matmul read 297-365 us.
        Requests of 1-10 MB share 20 MB segments and could run out the same way; they are not reserved (the slow
        calls seen were small-pool ones, and this is what ran on the GPU); from 10 MB a request gets a segment of
        its own, cached from the workload's warm-up and earlier bursts. The output's sizes come from the heat, not
        from a call of its own: one more call between the heat and the burst made TriMul's fillers grow from 3.1 to
        5.2 s (session 13, every time, cause not found)."""
        if not self.cuda:
            return
        sizes = small_block_sizes(_leaves(held)) + self.output_small_sizes
        blocks = [self.empty(n, dtype=self.uint8, device="cuda") for _ in range(count + 2) for n in sizes]
        del blocks

    def idle_gap_us(self) -> float:
        """Device time between an event and the next one this process records after a device-wide synchronize, on
        an idle device: the same steps as the tail of a timed call, with nothing left running."""
        self.sync()
        a, b = self.Event(enable_timing=True), self.Event(enable_timing=True)
        self.record(a)
        self.sync()
        self.record(b)
        self.event_sync(b)
        return self.elapsed(a, b) * 1e3


def timed_burst(timer: Timer, count: int, next_call, seen=None, filler=None, held=None) -> list[tuple]:
    """Time ``count`` calls one after another, each on inputs ``next_call(k)`` generates just before it (returning
    (fn, args)): [(snapshot of the output, device us, tail us, probe us, host us)] (see ``Timer.time``);
    ``seen(snapshot)``, if given, right after each snapshot. ``filler``: (fn, args) of the caller's heat, called
    back to back between timed calls (``Timer.fill``); the small blocks the burst will hold are made and freed
    before its first call (``Timer.reserve_small_blocks``: ``held``, what each call's kept inputs hold, if not just
    the filler's arguments). The reference (in the judge) and the candidate (here) both go through it.

    After ``Timer.heat`` (the caller's, on other inputs), each call follows the previous one with only filler calls,
    its input generation, the launch cover (with the L2 flush), a device-wide synchronize and an output copy in
    between, as FlashInfer-Bench (a synchronize and a copy of the inputs between calls) and GPU MODE (fresh inputs
    between calls) time. The inputs of a call do not exist before the previous call has finished: a candidate that
    found them earlier could work ahead on them (tests/cheats/work_ahead.py).

    Why the fillers: without them the calls filled 61% of the time for an 8192^3 bf16 matmul on an H200 (input
    generation and checks the rest), which kept it below the power limit: it read 1.39-1.43 ms against 1.56-1.61 ms
    in ``triton.testing.do_bench`` and in a loop of itself (BENCHMARKS.md, session 5).
    """
    if filler is not None:
        timer.reserve_small_blocks(filler[1] if held is None else held, count)
    done = []
    gap_s = 0.0
    for k in range(count):
        if filler is not None and k:
            timer.fill(*filler, gap_s, done[-1][1])
        t0 = timer.perf()
        fn, args = next_call(k)
        done.append(timer.time_and_copy(fn, args))
        times = done[-1][1:]
        del fn, args
        if seen is not None:
            seen(done[-1][0])
        gap_s = max(0.0, timer.perf() - t0 - times[0] * 1e-6)  # times[0]: the call's device time
    return done


def small_block_sizes(values) -> list[int]:
    """Bytes of the allocations behind the CUDA tensors among ``values`` that torch's caching allocator serves from
    its small pool (a view's is its storage's; a sparse tensor has none of its own)."""
    sizes = [t.untyped_storage().nbytes() for t in values
             if type(t) is _TENSOR and t.is_cuda and t.layout is torch.strided]
    return [n for n in sizes if 0 < n <= SMALL_BLOCK_BYTES]


def output_items(out) -> list:
    """An output's parts, as the judge sees them: a list or tuple (a subclass read through the base type's iterator,
    which runs none of the candidate's code), or the one value."""
    if isinstance(out, (list, tuple)):
        return list(tuple.__iter__(out) if isinstance(out, tuple) else list.__iter__(out))
    return [out]


def snapshot(out, sync):
    """A copy taken right after the device went idle: work that writes the output later does not count. A name
    for what is not a tensor or a tuple/list of tensors (the judge reports the type).

    Copied without running the candidate's code: a tensor subclass (its __torch_function__ or __torch_dispatch__
    would run on the copy) is refused, and a list or tuple subclass is read through the base type's iterator."""
    items = output_items(out)
    if not all(isinstance(t, _TENSOR) for t in items):
        return type(out).__name__
    odd = next((t for t in items if type(t) is not _TENSOR), None)
    if odd is not None:
        return f"a {type(odd).__name__} (a torch.Tensor subclass: return plain tensors)"
    with _NO_TORCH_FUNCTION():  # a torch function mode the candidate entered would run here
        copies = [_CLONE(_DETACH(t)) for t in items]
    sync()
    return tuple(copies) if isinstance(out, (list, tuple)) else copies[0]


def precise_enough(times: list[float], started_s: float, budget_s: float, now_s: float, min_runs: int = MIN_RUNS,
                   limited: bool = False, sizes: list[int] | None = None, next_burst_s: float | None = None,
                   first_heat_s: float = 0.0) -> bool:
    """The adaptive stopping rule shared by reference and candidate timing; ``limited``: the workload is
    power-limited (TARGET_RSE_LIMITED); ``sizes``: the calls of each burst so far, in order (default: one burst);
    ``next_burst_s``: what one more burst would take, its heat included; ``first_heat_s``: the heat before the
    first burst, which runs until the calls stop slowing (0.02-0.5 s).

    A power-limited workload's calls share their burst's clock state: its burst means scatter more than its calls
    say (a 4096^3 bf16 matmul on the H200: 1.3% per call within a burst, 1.5% between the means of 10-call bursts
    0.26 s apart, session 16), so one burst's error is not the mean's, and evaluations that stopped after one burst
    read 2.5-2.9% apart. Such a workload gets LIMITED_MIN_BURSTS bursts where they all fit in the budget (a cheap
    burst: three of that matmul's cost 0.8 s), the first heat left out of that sum so that it does not decide how
    many follow (the budget itself counts it: counted from the heat's end, TriMul's largest workloads, whose calls
    vary 1.9% with their inputs, took a second 1.1 s burst, session 16). From two bursts on, its error is the larger
    of the calls' standard error and the burst means' (two means can agree by chance). Where three do not fit
    (TriMul's bursts take 0.5-1.3 s each; their means agreed within 0.1-0.3%), one burst whose calls are precise
    enough ends its timing, as before."""
    n = len(times)
    if n >= MAX_RUNS:
        return True
    if n < min_runs:
        return False
    sizes = sizes or [n]
    spent = now_s - started_s
    if limited and len(sizes) < LIMITED_MIN_BURSTS and next_burst_s is not None and (
            spent - first_heat_s + (LIMITED_MIN_BURSTS - len(sizes)) * next_burst_s <= budget_s):
        return False
    mean = sum(times) / n
    error = _standard_error(times)
    if limited and len(sizes) > 1:
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        means = [sum(times[start:start + size]) / size for start, size in zip(starts, sizes)]
        error = max(error, _standard_error(means))
    target = TARGET_RSE_LIMITED if limited else TARGET_RSE
    return error / mean < target or spent > budget_s


def _standard_error(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))


def later_heat_s(limited: bool) -> float:
    """The heat before a workload's later bursts (see HEAT_S)."""
    return HEAT_MIN_S if limited else HEAT_S


# --- the runner -----------------------------------------------------------------------------------------------------


def isolate_network() -> str:
    """Enter new user + network namespaces: only a loopback interface, which is down. Needs a single thread."""
    if not sys.platform.startswith("linux"):
        return "no (not Linux)"
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(0x10000000 | 0x40000000) != 0:  # CLONE_NEWUSER | CLONE_NEWNET
        return f"no (unshare: {os.strerror(ctypes.get_errno())})"
    try:  # keep our own uid/gid inside, so files keep their owners
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    except OSError:
        pass
    return "yes"


def die_with_parent(parent: int) -> None:
    """SIGKILL when ``parent`` dies (Linux), and exit now if it already has: no GPU kept busy for nobody."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
        except (OSError, AttributeError):
            pass
        if os.getppid() != parent:
            os._exit(1)


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
    except Exception as e:  # the compiler's own output is in the message; keep its errors, not its command lines
        lines = [line for line in str(e).splitlines() if "error" in line.lower() or "undefined" in line.lower()]
        raise Failure("compile_error", clip("\n".join(lines[-20:]) or str(e))) from None
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
    def __init__(self, conn, cfg: dict, reference_module, make_inputs, entry, timer: Timer, patches: LibraryPatches):
        """``make_inputs``: the task's, bound before the candidate was imported (it could replace the module's)."""
        self.conn, self.cfg, self.timer, self.patches = conn, cfg, timer, patches
        self.device, self.root = cfg["device"], cfg["candidate"]
        self.make_inputs = make_inputs
        self.entry = entry
        self.held = []  # the last burst's (output, inputs) per timed call, until the judge has checked what it chose
        self.reference_calls = 0
        original = reference_module.reference

        def counted(*a, **k):  # calling the task's reference is allowed, but the result says so
            self.reference_calls += 1
            return original(*a, **k)

        reference_module.reference = counted

    def flags(self, patches: bool = True) -> dict:
        """What the judge checks after each call and burst; ``patches``: look for replaced library functions too
        (LibraryPatches, ~0.7 ms), not needed when an output already checked is sent again."""
        flags = {"reference_calls": self.reference_calls, "power_limited": self.timer.power_limited,
                 "heat_s": self.timer.spent_s["heat"], "fill_s": self.timer.spent_s["fill"]}
        if self.timer.hooks is not None and self.timer.hooks.found:
            flags["interpreter_hooks"] = list(self.timer.hooks.found)
        replaced = self.patches.found() if patches else []
        if replaced:
            flags["library_patches"] = replaced
        runtime = self.timer.runtime
        if runtime is not None:
            now = runtime.persisting_l2_bytes()
            if now is not None and now != runtime.default_persisting_l2:
                flags["persisting_l2_bytes"] = now
        return flags

    def serve(self) -> None:
        # Inference, as the judge calls the reference: a module's parameters would otherwise make every call record
        # an autograd graph the reference never pays for.
        torch.set_grad_enabled(False)
        while True:
            msg = self.conn.recv()
            op = msg[0]
            if op == "exit":
                return
            if op == "drop":
                self.held = []
            elif op == "send":  # one of the last burst's calls, chosen by the judge after the burst
                out, inputs = self.held[msg[1]]
                self.conn.send(("out", out, inputs, None, 0.0, self.flags(patches=False)))
            elif op == "burst":
                self.burst(*msg[1:])
            else:
                self.call(op, *msg[1:])

    def inputs(self, workload: str, params: dict, seed: int) -> tuple:
        """(inputs, fn, args) of one seed; a failure here is the task's make_inputs failing in this process."""
        try:
            inputs = self.make_inputs(params, seed, self.device)
            return (inputs, *prepare(self.entry, inputs, self.cfg["kind"], self.device))
        except BaseException as e:
            self.conn.send(("error", "runtime_error", f"workload {workload}: generating its inputs failed:\n"
                            + describe(e, self.root)))
            raise Reported from None

    def burst(self, workload: str, params: dict, count: int, heat_seed: int, first: bool) -> None:
        """``count`` timed calls, each on its own inputs; outputs and inputs held for the judge's checks, and each
        output's fingerprint sent now: an output changed after its call (a thread, say) is caught.

        Each call's seed is asked of the judge only when the call is next: had this process the whole burst's seeds,
        a candidate could find them (and ``make_inputs``) in its memory and compute later calls' outputs in the heat
        or in an earlier call (tests/cheats/future_seeds.py)."""
        self.held = []
        progress(f"time {workload} x{count}")
        kept = []

        def next_call(k: int) -> tuple:
            self.conn.send(("next", k))
            reply = self.conn.recv()
            inputs, fn, args = self.inputs(workload, params, reply[1])
            kept.append(inputs)
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
            self.conn.send(("error", "runtime_error", describe(e, self.root)))
            raise Reported from None
        self.held = [(out, inputs) for (out, *_), inputs in zip(done, kept)]
        untimed = sorted(self.timer.untimed_us)
        self.conn.send(("timed", [times for _, *times in done], prints, self.flags(),
                        untimed[len(untimed) // 2] if untimed else None))

    def call(self, op: str, workload: str, params: dict, seed: int, first: bool) -> None:
        self.held = []
        inputs, fn, args = self.inputs(workload, params, seed)
        before = fingerprint(inputs) if op == "call" else None
        progress(f"{op} {workload}")
        try:
            t0 = self.timer.perf()
            out = fn(*args)
            if self.timer.hooks is not None:
                self.timer.hooks.disarm()
            self.timer.sync()  # asynchronous CUDA errors surface here, and belong to this call
            seconds = self.timer.perf() - t0
            if op == "warm":
                self.conn.send(("warmed", seconds))
                return
            self.conn.send(("out", snapshot(out, self.timer.sync), inputs, before, seconds, self.flags()))
        except BaseException as e:
            status = "compile_error" if first and is_compiler_error(e) else "runtime_error"
            self.conn.send(("error", status, describe(e, self.root)))
            raise Reported from None  # after a CUDA error this process is unusable; the judge is done anyway


def start_failure(exc: BaseException, cfg: dict) -> tuple:
    return "error", "runtime_error", "the candidate's process failed to start:\n" + describe(exc, cfg["candidate"])


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
        load_torch()  # torch does not import triton, so TRITON_INTERPRET can still be set below
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
    conn.send(("loaded", {"network_isolated": network, "device": cfg["device"],
                           "host_spin_wait": bool(timer.runtime and timer.runtime.spin_wait),
                           "launch_cover": timer.cover_kind}))
    msg = conn.recv()
    if msg[0] != "import":
        return
    cfg.update(msg[1])
    try:
        reference_module = load_module("ksearch_task_inputs", cfg["reference"])
        sys.path[0] = cfg["candidate"]  # was the harness's folder; candidates may import their own helper modules
        progress("import candidate")
        timer.hooks = InterpreterHooks()  # what the process has before the candidate's code first runs
        patches = LibraryPatches(reference_module)
        make_inputs = reference_module.make_inputs
        t0 = time.perf_counter()
        entry = load_candidate(cfg)
        compile_s = time.perf_counter() - t0
    except Failure as f:
        conn.send(("error", f.status, f.message))
        return
    except BaseException as e:
        conn.send(start_failure(e, cfg))
        return
    conn.send(("ready", compile_s))
    try:
        Runner(conn, cfg, reference_module, make_inputs, entry, timer, patches).serve()
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
