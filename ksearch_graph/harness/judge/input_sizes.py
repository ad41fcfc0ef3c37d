"""How much memory a workload's inputs take, known before anything is allocated: the task's make_inputs run on torch's
meta device (tensors with shapes and dtypes, no data), and the judge refuses a workload whose copies would not fit.

On the meta device every tensor torch makes is meta: factories without a device (torch.device("meta")), factories
and ``.to()`` with one (rewritten), ``.cuda()`` / ``.cpu()`` (no-ops); ``torch.Generator(device=...)`` gives a CPU
generator, dropped from every call (meta tensors draw nothing). Where make_inputs does something a tensor without
data cannot (``.item()``, NumPy, reading its values), the size is unknown (None) and the evaluation goes on as
before; memory that NumPy or Python allocate themselves is not counted.
"""

from __future__ import annotations

import contextlib
import os

from ksearch_graph.harness._torch import load_torch
from ksearch_graph.harness.tasks import prepare
from ksearch_graph.harness.tensors import as_tensors, leaves, nbytes

# The judge holds at once: its pristine inputs, the reference's clone of them and the inputs the candidate's process
# sends back (shared with it); the reference's output and the candidate's.
JUDGE_INPUT_COPIES = 3
JUDGE_OUTPUT_COPIES = 2


class InputsTooLarge(ValueError):
    """A workload whose inputs and outputs, as the judge holds them, exceed its memory limit."""


@contextlib.contextmanager
def on_meta():
    """Everything torch makes inside is a meta tensor (see the module's docstring)."""
    torch = load_torch()
    from torch.overrides import TorchFunctionMode

    tensor, generator = torch.Tensor, torch.Generator

    class MetaEverything(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func in (tensor.cuda, tensor.cpu, tensor.pin_memory):
                return args[0]
            if func is tensor.to:  # .to("cuda"), .to(device), .to(0): the device part becomes meta
                args = args[:1] + tuple("meta" if isinstance(a, (str, torch.device)) or type(a) is int else a
                                        for a in args[1:])
            if "device" in kwargs:
                kwargs["device"] = "meta"
            kwargs.pop("generator", None)  # a meta tensor draws nothing (and a generator takes a slower path)
            return func(*args, **kwargs)

    class CpuGenerator(generator):  # torch.Generator(device="cuda") on a machine without one
        def __new__(cls, device=None):  # noqa: ARG004
            return generator()

    validate = torch.distributions.Distribution._validate_args
    torch.Generator = CpuGenerator
    torch.distributions.Distribution.set_default_validate_args(False)  # validation reads values
    try:
        with torch.device("meta"), MetaEverything():
            yield
    finally:
        torch.Generator = generator
        torch.distributions.Distribution.set_default_validate_args(validate)


def all_meta(value) -> bool:
    torch = load_torch()
    return all(t.device.type == "meta" for t in leaves(value) if isinstance(t, torch.Tensor))


def estimate(ref, params: dict, kind: str = "function") -> tuple[int, int | None] | None:
    """(bytes of one input set, bytes of the reference's output or None where the reference does not run on the
    meta device) of the task module ``ref`` (make_inputs, reference) for ``params``; None where make_inputs does not
    run there. For a ``module`` task the inputs are the model's state dict and the forward inputs."""
    torch = load_torch()
    try:
        with on_meta(), torch.no_grad():
            inputs = ref.make_inputs(params, 0, "meta")
            if not all_meta(inputs):
                return None
            size = nbytes(inputs[1:] if kind == "module" else inputs)
            try:
                fn, args = prepare(ref.reference, inputs, kind, "meta")
                out = as_tensors(fn(*args))
                out_bytes = nbytes(out) if out is not None and all_meta(out) else None
            except Exception:  # noqa: BLE001 (a reference that reads values: its output size is unknown)
                out_bytes = None
    except Exception:  # noqa: BLE001 (make_inputs that reads values, or NumPy: unknown)
        return None
    return size, out_bytes


def judge_bytes(input_bytes: int, output_bytes: int | None) -> int:
    return JUDGE_INPUT_COPIES * input_bytes + JUDGE_OUTPUT_COPIES * (output_bytes or 0)


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_input_sizes(ref, task: dict, limit_bytes: int, limit_name: str = "the judge's memory limit") -> dict:
    """Every workload's sizes ({name: (input bytes, output bytes)} for those known); InputsTooLarge for the first
    whose copies in the judge exceed ``limit_bytes``, before any of its tensors exists."""
    sizes = {}
    for w in task["workloads"]:
        got = estimate(ref, w["params"], task.get("entry_kind", "function"))
        if got is None:
            continue
        sizes[w["name"]] = got
        need = judge_bytes(*got)
        if need > limit_bytes:
            inputs, outputs = got
            raise InputsTooLarge(
                f"workload {w['name']}: one input set is {gib(inputs)}"
                + (f" and the reference's output {gib(outputs)}" if outputs else "")
                + f" (measured on torch's meta device, before allocating); the judge holds {JUDGE_INPUT_COPIES} input "
                f"sets and {JUDGE_OUTPUT_COPIES} outputs at once, {gib(need)}, over {limit_name} of "
                f"{gib(limit_bytes)}: shrink the workload or raise the limit")
    return sizes


def host_memory_bytes() -> int:
    """This machine's physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
