"""The messages between the judge and the candidate's process, as named types that pickle as plain data (a class
reference and its fields), and the judge's strict reader of what the candidate's process sends.

Judge to runner: ``Ping`` (answered ``Pong``: the round trip, before any candidate code runs), ``Import`` once, then
``Call`` / ``Warm`` (one call on one seed's inputs), ``Burst`` (timed calls; the runner asks each call's seed with
``Next`` and gets a ``Seed``), ``Send`` / ``Drop`` (a held call of the last burst), ``Exit``. Runner to judge:
``Loaded`` (torch imported, no candidate code run yet), ``Pong``, ``Armed`` then ``Ready`` (the guards armed, then the
candidate imported), ``Output``, ``Warmed``, ``Next``, ``Timed``, or ``Error`` for any of them.
"""

from __future__ import annotations

import pickle
from typing import Any, NamedTuple

from ._torch import load_torch

# --- judge to runner ------------------------------------------------------------------------------------------------


class Ping(NamedTuple):
    """Answer at once (``Pong``): the judge measures the round trip for its bound on the timings (time_bound.py)."""


class Import(NamedTuple):
    """Import (or build) the candidate: reference, solution_file, entry_point, kind, form; and timing (the task's
    timing mode, Timer.use_timing)."""
    task: dict


class Call(NamedTuple):
    """A correctness call on the inputs of ``seed``; ``first``: the candidate's first call (its JIT compile)."""
    workload: str
    params: dict
    seed: int
    first: bool


class Warm(NamedTuple):
    """A warm-up call before a workload's timing, answered with how long it took."""
    workload: str
    params: dict
    seed: int
    first: bool


class Burst(NamedTuple):
    """``count`` timed calls after a heat on the inputs of ``heat_seed``; ``first``: the workload's first burst."""
    workload: str
    params: dict
    count: int
    heat_seed: int
    first: bool


class Seed(NamedTuple):
    """The seed of the timed call the runner asked for (``Next``)."""
    seed: int


class Send(NamedTuple):
    """Send the output and inputs of the last burst's call ``index``."""
    index: int


class Drop(NamedTuple):
    """Let go of the last burst's outputs and inputs."""


class Exit(NamedTuple):
    """End the process."""


# --- runner to judge --------------------------------------------------------------------------------------------


class Flags(NamedTuple):
    """What the judge checks after each call and burst (Runner.flags); the candidate's process fills it, so the judge
    reads every field as untrusted data."""
    reference_calls: Any = 0
    power_limited: Any = False
    heat_s: Any = 0.0  # the process's heat time so far (s)
    fill_s: Any = 0.0  # its filler time so far (s)
    interpreter_hooks: Any = None  # what guards.InterpreterHooks found, if anything
    library_patches: Any = None  # what guards.LibraryPatches found, if anything
    persisting_l2_bytes: Any = None  # a persisting L2 carve-out other than the device's own
    added_input_keys: Any = None  # dict keys the candidate added to its inputs (tensors.without_added_keys), if any
    harness_changed: Any = None  # what integrity.py found changed among the harness's own objects, if anything
    introspection: Any = None  # what audit.py blocked of the candidate's reach for them, if anything


class Loaded(NamedTuple):
    """torch is imported and no candidate code has run: network_isolated, device, host_spin_wait, launch_cover."""
    info: dict


class Pong(NamedTuple):
    """The answer to a ``Ping``."""


class Armed(NamedTuple):
    """The guards against forged timing are armed (forgery.py) and no candidate code has run: ``check_us``, what their
    check costs per timed call here (the shortest of a few), for the judge's bound (time_bound.py)."""
    check_us: float


class Ready(NamedTuple):
    """The candidate is imported (or built), in ``compile_s``."""
    compile_s: float


class Error(NamedTuple):
    """The request failed: ``status`` (an EvalResult status) and the message the LLM sees."""
    status: str
    message: str


class Output(NamedTuple):
    """One call's output (its snapshot, or the type name of what is not tensors) and its inputs after the call;
    ``inputs_before``: the inputs' fingerprint before the call (correctness calls only); ``seconds``: the call's host
    time."""
    out: Any
    inputs: Any
    inputs_before: Any
    seconds: float
    flags: Flags


class Warmed(NamedTuple):
    """A warm-up call took ``seconds``."""
    seconds: float


class Next(NamedTuple):
    """The runner is ready for the burst's call ``index``: the judge answers with its ``Seed``."""
    index: int


class Timed(NamedTuple):
    """A burst done: per call [device us, tail us, probe us, host us] and its output's fingerprint, the flags, and the
    median device time of the untimed (heat and filler) calls, or None."""
    calls: list
    fingerprints: list
    flags: Flags
    untimed_median_us: float | None


REPLIES = (Flags, Loaded, Pong, Armed, Ready, Error, Output, Warmed, Next, Timed)


class TensorsOnly(pickle.Unpickler):
    """The runner is untrusted: a plain pickle.loads of its messages would run whatever it chose in this process.
    Only tensors, plain data and the reply types above are rebuilt; a reply type gets its fields as they came (any
    of these types), so the judge checks them where it reads them."""

    ALLOWED = {
        ("torch.multiprocessing.reductions", n) for n in (
            "rebuild_tensor", "rebuild_cuda_tensor", "rebuild_typed_storage", "rebuild_storage_fd",
            "rebuild_storage_filename", "rebuild_storage_empty", "rebuild_typed_storage_child")
    } | {("torch", "Tensor"), ("torch", "Size"), ("torch", "device"), ("torch.storage", "UntypedStorage"),
         ("torch.storage", "TypedStorage"), ("multiprocessing.resource_sharer", "DupFd"),
         ("collections", "OrderedDict"), ("torch._utils", "_rebuild_tensor_v2")} | {
        (__name__, kind.__name__) for kind in REPLIES}

    def find_class(self, module: str, name: str):
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        torch = load_torch()
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"the candidate's process sent a {module}.{name}, not a plain tensor")
