"""The wire between the judge and the candidate's process: one socket, one message per datagram, JSON, and a strict
reader on the judge's side.

The candidate's process is the candidate's (it may stop running harness code at import and speak this protocol
itself), so what it sends is data the judge parses against an exact schema (``parse``): each field has one type (an
int is an int, never a float or a tensor; a float is finite), sizes and lengths are bounded, and a message of any
other shape makes the candidate suspicious. Tensors never travel here: the judge lends memory by file descriptor
(``shared_memory.py``, SCM_RIGHTS on this socket) and reads outputs out of it itself. The judge accepts no
descriptor from the candidate's process (the kernel drops any it sends) and acts on no address or path it names.

Judge to candidate (``JUDGE_SENDS``): ``Begin`` (touch the device now), ``Import`` (the candidate's entry point, the task's reference files),
``Load`` (import the candidate), ``Lend`` (the output slot; a descriptor), ``Call`` / ``Warm`` (one call on inputs the judge made; a descriptor),
``Calibrate`` / ``Burst`` (timed calls: the candidate's process says ``Ready``, the judge lends the call's input
memory, still empty, with ``Stage``, the candidate's process maps it and says ``Staged``, the judge starts its clock,
fills the memory and says ``Go``, the candidate's process answers ``Done``, the judge ``Taken``), ``Exit``. Candidate
to judge (``CANDIDATE_SENDS``): ``Loaded``, ``Prepared``, ``Imported``, ``Output``, ``Warmed``, ``Ready``, ``Staged``,
``Done``, ``Timed``, ``Error``.
"""

from __future__ import annotations

import array
import json
import math
import os
import select
import socket
import time
from typing import NamedTuple

MAX_FROM_CANDIDATE = 64 << 10  # bytes of one message from the candidate's process
MAX_DATAGRAM = 128 << 10  # a larger message from the judge travels in a memfd
MAX_FDS = 2
DTYPES = ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
          "float8_e5m2fnuz", "int64", "int32", "int16", "int8", "uint8", "uint16", "uint32", "uint64", "bool",
          "complex64", "complex128")
STATUSES = ("compile_error", "runtime_error", "incorrect_shape", "incorrect_numerical", "timeout", "suspicious",
            "unavailable")


# --- judge to the candidate's process -------------------------------------------------------------------------------

class Begin(NamedTuple):
    """Make the device's context and the timer now, then answer ``Loaded``: torch is imported first, off the device,
    and the device is touched only when the judge holds it for this (gpu_share.py)."""


class Import(NamedTuple):
    """The task: the candidate's entry_point, kind, form, solution_file, the timing mode, the reference's file name
    and the task's reference files ({name: text}), loaded as the reference module (candidates may call it)."""
    task: dict


class Load(NamedTuple):
    """Import (or build) the candidate, the guards armed first."""


class Lend(NamedTuple):
    """The output slot, ``nbytes`` long (its descriptor attached): every output is written here. Replaces any
    earlier one."""
    nbytes: int


class Call(NamedTuple):
    """A correctness call on the judge's inputs (``inputs``: lending.py's tree over the attached regions, one per
    [device, nbytes] of ``regions``); ``first``: the candidate's first call (its JIT compile)."""
    workload: str
    first: bool
    inputs: list
    regions: list


class Warm(NamedTuple):
    """A warm-up call before a workload's timing, answered with how long it took."""
    workload: str
    inputs: list
    regions: list


class Burst(NamedTuple):
    """``count`` timed calls after a heat on the attached inputs (``heat``); ``first``: the workload's first burst."""
    workload: str
    count: int
    first: bool
    heat: list
    regions: list


class Calibrate(NamedTuple):
    """Before the candidate is imported: ``count`` timed calls, as a burst makes them, of a function that does no
    work and returns empty tensors of ``outputs`` ([shape, dtype] each): the judge's measure of what surrounds a
    timed call (time_bound.py)."""
    workload: str
    count: int
    outputs: list


class Stage(NamedTuple):
    """Map timed call ``index``'s input memory (attached; ``inputs`` and ``regions`` as in ``Call``) and answer
    ``Staged``. The memory holds no inputs yet: the judge writes them after its clock started, so mapping it (a few
    hundred us of driver calls on a GPU, and their jitter) stays outside the judge's interval and nothing can be
    worked out ahead."""
    index: int
    inputs: list
    regions: list


class Go(NamedTuple):
    """Make timed call ``index`` now: its staged memory holds its inputs."""
    index: int


class Taken(NamedTuple):
    """The judge has its copy of call ``index``'s output: the slot may be written again."""
    index: int


class Exit(NamedTuple):
    """End the process."""


# --- the candidate's process to the judge ---------------------------------------------------------------------------

class Loaded(NamedTuple):
    """torch is imported and no candidate code has run: network_isolated, device, host_spin_wait, launch_cover."""
    info: dict


class Prepared(NamedTuple):
    """The task's reference module is loaded."""


class Imported(NamedTuple):
    """The candidate is imported (or built), in ``compile_s``."""
    compile_s: float


class Output(NamedTuple):
    """A correctness call's output (``output``: where in the slot, or what it was instead of tensors), its host time
    and the in-process guards' flags."""
    output: dict
    seconds: float
    flags: dict


class Warmed(NamedTuple):
    """A warm-up call took ``seconds``."""
    seconds: float


class Ready(NamedTuple):
    """Timed call ``index`` may come (the judge answers ``Stage``)."""
    index: int


class Staged(NamedTuple):
    """Timed call ``index``'s input memory is mapped (the judge answers ``Go``)."""
    index: int


class Done(NamedTuple):
    """Timed call ``index`` is over and its output is in the slot: [device us, tail us, probe us, host us, launch us,
    own us] as the candidate's process measured them (data to check, never trusted; ``own``: from its ``Go`` to this
    message, which the timing trace sets beside the judge's interval)."""
    index: int
    times: list
    output: dict


class Timed(NamedTuple):
    """A burst done: the guards' flags and the median device time of its untimed calls (heat, fillers), or None."""
    flags: dict
    untimed_median_us: float | None


class Error(NamedTuple):
    """The request failed: ``status`` (an EvalResult status) and the message the LLM sees."""
    status: str
    message: str


JUDGE_SENDS = (Begin, Import, Load, Lend, Call, Warm, Burst, Calibrate, Stage, Go, Taken, Exit)
CANDIDATE_SENDS = (Loaded, Prepared, Imported, Output, Warmed, Ready, Staged, Done, Timed, Error)
_BY_NAME = {kind.__name__: kind for kind in JUDGE_SENDS + CANDIDATE_SENDS}


class Malformed(ValueError):
    """What the candidate's process sent is not a message of the protocol (the judge makes it suspicious)."""


# --- the schema of what the candidate's process sends ---------------------------------------------------------------

def _int(v, lo: int = 0, hi: int = 1 << 62) -> int:
    if type(v) is not int or not lo <= v <= hi:
        raise Malformed(f"expected an int in [{lo}, {hi}], got {_name(v)}")
    return v


def _float(v, lo: float = -1e12, hi: float = 1e12) -> float:
    if type(v) is int:
        v = float(v)
    if type(v) is not float or not math.isfinite(v) or not lo <= v <= hi:
        raise Malformed(f"expected a finite number in [{lo:g}, {hi:g}], got {_name(v)}")
    return v


def _bool(v) -> bool:
    if type(v) is not bool:
        raise Malformed(f"expected true or false, got {_name(v)}")
    return v


def _str(v, limit: int = 300) -> str:
    if type(v) is not str or len(v) > limit:
        raise Malformed(f"expected a string of at most {limit} characters, got {_name(v)}")
    return v


def _names(v) -> list[str] | None:
    """A flag's findings: None, or up to 40 short strings."""
    if v is None:
        return None
    if type(v) is not list or len(v) > 40:
        raise Malformed(f"expected a list of at most 40 findings, got {_name(v)}")
    return [_str(x) for x in v]


def _name(v) -> str:
    text = type(v).__name__
    return f"{text} {str(v)[:40]!r}" if isinstance(v, (int, float, str)) else text


FLAG_FIELDS = {
    "reference_calls": lambda v: _int(v),
    "power_limited": _bool,
    "heat_s": lambda v: _float(v, 0.0),
    "fill_s": lambda v: _float(v, 0.0),
    "interpreter_hooks": _names,  # guards.InterpreterHooks' findings
    "library_patches": _names,  # guards.LibraryPatches'
    "persisting_l2_bytes": lambda v: None if v is None else _int(v),
    "harness_changed": _names,  # integrity.py's
    "introspection": _names,  # audit.py's
}


def parse_flags(v) -> dict:
    """The in-process guards' flags: exactly FLAG_FIELDS."""
    if type(v) is not dict or set(v) != set(FLAG_FIELDS):
        raise Malformed("flags with other fields than the protocol's")
    return {k: check(v[k]) for k, check in FLAG_FIELDS.items()}


def parse_output(v) -> dict:
    """Where an output lies in the slot ({"tensors": [[offset, dtype, shape], ...], "tuple": bool}), or what was
    returned instead of tensors ({"other": "name"})."""
    if type(v) is not dict:
        raise Malformed(f"expected an output description, got {_name(v)}")
    if set(v) == {"other"}:
        return {"other": _str(v["other"], 200)}
    if set(v) != {"tensors", "tuple"} or type(v["tensors"]) is not list or not 0 < len(v["tensors"]) <= 64:
        raise Malformed("an output description of another shape than the protocol's")
    tensors = []
    for item in v["tensors"]:
        if type(item) is not list or len(item) != 3:
            raise Malformed("a tensor description is [offset, dtype, shape]")
        offset, dtype, shape = item
        if type(shape) is not list or len(shape) > 8:
            raise Malformed("a tensor shape is a list of at most 8 sizes")
        if dtype not in DTYPES:
            raise Malformed(f"unknown dtype {_name(dtype)}")
        tensors.append((_int(offset), dtype, tuple(_int(s, 0, 1 << 40) for s in shape)))
    return {"tensors": tensors, "tuple": _bool(v["tuple"])}


SCHEMA = {
    Loaded: {"info": lambda v: _info(v)},
    Prepared: {},
    Imported: {"compile_s": lambda v: _float(v, 0.0)},
    Output: {"output": parse_output, "seconds": lambda v: _float(v, 0.0), "flags": parse_flags},
    Warmed: {"seconds": lambda v: _float(v, 0.0)},
    Ready: {"index": lambda v: _int(v, 0, 1 << 20)},
    Staged: {"index": lambda v: _int(v, 0, 1 << 20)},
    Done: {"index": lambda v: _int(v, 0, 1 << 20), "times": lambda v: _times(v), "output": parse_output},
    Timed: {"flags": parse_flags, "untimed_median_us": lambda v: None if v is None else _float(v, 0.0)},
    Error: {"status": lambda v: _status(v), "message": lambda v: _str(v, 20000)},
}


def _info(v) -> dict:
    fields = {"network_isolated": _str, "device": lambda x: _str(x, 20), "host_spin_wait": _bool,
              "launch_cover": _str}
    if type(v) is not dict or set(v) != set(fields):
        raise Malformed("a start-up report of another shape than the protocol's")
    return {k: check(v[k]) for k, check in fields.items()}


def _times(v) -> list[float]:
    if type(v) is not list or len(v) != 6:
        raise Malformed("a timed call's times are [device us, tail us, probe us, host us, launch us, own us]")
    return [_float(x, -1e6, 1e9) for x in v]


def _status(v) -> str:
    if v not in STATUSES:
        raise Malformed(f"unknown status {_name(v)}")
    return v


def parse(data: bytes, expect: tuple) -> tuple:
    """One message from the candidate's process, checked field by field; ``expect``: the types the judge waits
    for (an Error is always one). Raises Malformed."""
    try:
        raw = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise Malformed(f"not a JSON message ({type(e).__name__})") from None
    if type(raw) is not dict or type(raw.get("type")) is not str:
        raise Malformed("a message without a type")
    kind = _BY_NAME.get(raw.pop("type"))
    if kind not in CANDIDATE_SENDS:
        raise Malformed("a message type the candidate's process does not send")
    if kind not in expect and kind is not Error:
        raise Malformed(f"{kind.__name__}, not {' or '.join(k.__name__ for k in expect)}")
    fields = SCHEMA[kind]
    if set(raw) != set(fields):
        raise Malformed(f"a {kind.__name__} with other fields than the protocol's")
    return kind(**{name: check(raw[name]) for name, check in fields.items()})


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number the protocol sends")


def encode(msg: tuple) -> bytes:
    return json.dumps({"type": type(msg).__name__, **msg._asdict()}, separators=(",", ":")).encode()


# --- the socket -----------------------------------------------------------------------------------------------------

def pair() -> tuple[socket.socket, socket.socket]:
    """(judge's end, the candidate's end): a datagram socket pair, one message per datagram."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


class Channel:
    """One end of the pair. ``send`` a message with descriptors; ``receive`` the next datagram: (bytes,
    descriptors) where descriptors are accepted (``with_fds``), else bytes alone."""

    def __init__(self, sock: socket.socket):
        self.sock = sock

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, msg: tuple, fds: tuple[int, ...] = ()) -> None:
        data = encode(msg)
        if len(data) > MAX_DATAGRAM:  # a large message (the task's reference files) travels in a memfd
            big = os.memfd_create("ksearch-message", os.MFD_CLOEXEC)
            try:
                os.write(big, data)
                self._send(json.dumps({"type": "_memfd", "nbytes": len(data)}).encode(), (big, *fds))
            finally:
                os.close(big)
            return
        self._send(data, fds)

    def _send(self, data: bytes, fds: tuple[int, ...]) -> None:
        if fds:
            self.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        else:
            self.sock.sendall(data)

    def poll(self, timeout_s: float) -> bool:
        return bool(select.select([self.sock], [], [], max(0.0, timeout_s))[0])

    def spin(self, seconds: float) -> bool:
        """Whether a message came within ``seconds``, polled without sleeping (POLICY.spin_wait_s says why)."""
        until = time.perf_counter() + seconds
        while time.perf_counter() < until:
            if select.select([self.sock], [], [], 0)[0]:
                return True
        return False

    def receive_untrusted(self) -> bytes:
        """The candidate's next datagram, without any descriptor it attached (the kernel closes those). EOFError
        when its end is closed; Malformed for one longer than MAX_FROM_CANDIDATE."""
        data, _, flags, _ = self.sock.recvmsg(MAX_FROM_CANDIDATE + 1)
        if not data:
            raise EOFError
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(data) > MAX_FROM_CANDIDATE:
            raise Malformed(f"a message over {MAX_FROM_CANDIDATE} bytes, or with descriptors")
        return data

    def receive_from_judge(self) -> tuple[tuple, list[int]]:
        """The judge's next message and the descriptors attached to it (the candidate's side; the judge is trusted)."""
        fds = array.array("i")
        data, ancillary, _, _ = self.sock.recvmsg(MAX_DATAGRAM + 1, socket.CMSG_LEN((MAX_FDS + 1) * fds.itemsize))
        if not data:
            raise EOFError
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
        fds = list(fds)
        raw = json.loads(data)
        if raw.get("type") == "_memfd":
            big = fds.pop(0)
            raw = json.loads(os.pread(big, raw["nbytes"], 0))
            os.close(big)
        return _BY_NAME[raw.pop("type")](**raw), fds

    def close(self) -> None:
        self.sock.close()


def dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")
