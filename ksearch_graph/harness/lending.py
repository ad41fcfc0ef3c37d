"""Inputs the judge lends and outputs it takes back, through shared memory (``shared_memory.Region``).

The judge lays a call's inputs out in fresh regions (one per device kind that holds any; ``LentInputs``) and sends
their structure as a tree of plain data (``lay_out``); the candidate's process rebuilds the same structure over its own
mapping of the regions (``rebuild``). The candidate's process writes an output into the slot the judge lent
(``put_output``) and describes where; the judge copies it out into its own memory before it looks at it
(``take_output``), so nothing the candidate's process does later reaches what the judge compares.

Tree nodes (JSON lists): ``["T", region, offset, dtype, shape, strides or null]`` a tensor, ``["L", items]`` a list,
``["U", items]`` a tuple, ``["D", [[key, item], ...]]`` a dict, ``["V", value]`` None/bool/int/float/str,
``["dtype", name]``, ``["device", name]``.
"""

from __future__ import annotations

from ksearch_graph.harness._torch import load_torch, loaded
from ksearch_graph.harness.shared_memory import ALIGN, Region, aligned
from ksearch_graph.harness.tensors import output_items
from ksearch_graph.harness.wire import DTYPES, dtype_name


class Layout:
    """Where each tensor of an input structure goes: ``tree`` (sent), ``sizes`` (bytes per region, "cuda" first) and
    the (region index, offset, tensor, strides) of each tensor to copy."""

    def __init__(self):
        self.devices: list[str] = []
        self.sizes: list[int] = []
        self.copies: list[tuple[int, int, object, tuple | None]] = []

    def place(self, device: str, nbytes: int) -> tuple[int, int]:
        if device not in self.devices:
            self.devices.append(device)
            self.sizes.append(0)
        index = self.devices.index(device)
        offset = self.sizes[index]
        self.sizes[index] = aligned(offset + max(nbytes, 1), ALIGN)
        return index, offset

    @property
    def regions(self) -> list[list]:
        return [[d, n] for d, n in zip(self.devices, self.sizes)]


def dense(shape: tuple, strides: tuple) -> bool:
    """Whether a layout covers a block of memory exactly once (a permutation of a row-major one): then it is lent as
    it is, so a transposed input stays transposed."""
    expected = 1
    for size, stride in sorted(((s, st) for s, st in zip(shape, strides) if s != 1), key=lambda p: p[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def lay_out(inputs) -> tuple[list, Layout]:
    """(tree, layout) of an input structure as the task's make_inputs returned it. A value of another kind is the
    task's error (ValueError)."""
    torch = load_torch()
    layout = Layout()

    def walk(v):
        if isinstance(v, torch.Tensor):
            if v.layout is not torch.strided or dtype_name(v.dtype) not in DTYPES:
                raise ValueError(f"make_inputs returned a {v.layout} {v.dtype} tensor, which the harness cannot lend")
            keep = not v.is_contiguous() and dense(tuple(v.shape), tuple(v.stride()))
            strides = tuple(v.stride()) if keep else None
            count = v.numel() if strides is None else 1 + sum((s - 1) * st for s, st in zip(v.shape, strides))
            index, offset = layout.place(v.device.type, count * v.element_size())
            layout.copies.append((index, offset, v, strides))
            return ["T", index, offset, dtype_name(v.dtype), list(v.shape), list(strides) if strides else None]
        if isinstance(v, tuple):
            return ["U", [walk(x) for x in v]]
        if isinstance(v, list):
            return ["L", [walk(x) for x in v]]
        if isinstance(v, dict):
            if not all(isinstance(k, (str, int)) for k in v):
                raise ValueError("make_inputs returned a dict whose keys are not strings or ints")
            return ["D", [[k, walk(x)] for k, x in v.items()]]
        if v is None or isinstance(v, (bool, int, float, str)):
            return ["V", v]
        if isinstance(v, torch.dtype):
            return ["dtype", dtype_name(v)]
        if isinstance(v, torch.device):
            return ["device", str(v)]
        raise ValueError(f"make_inputs returned a {type(v).__name__}; the harness lends tensors, numbers, strings, "
                         "None, dtypes, devices and lists, tuples and dicts of them")

    return walk(inputs), layout


class LentInputs:
    """A call's inputs laid out in fresh, zeroed regions that hold none of them yet: ``tree``, ``spec``
    ([[device, nbytes], ...]) and ``regions`` are sent first; ``fill`` writes the inputs in later (a timed call's
    after the judge's clock started). The caller closes the regions once the call is over."""

    def __init__(self, inputs):
        self.tree, layout = lay_out(inputs)
        self.spec, self.copies = layout.regions, layout.copies
        self.regions = [Region.make(n, "cuda" if d == "cuda" else "cpu") for d, n in zip(layout.devices, layout.sizes)]
        self.cuda = "cuda" in layout.devices

    @property
    def fds(self) -> tuple[int, ...]:
        return tuple(r.fd for r in self.regions)

    def fill(self) -> None:
        """Copy the inputs in; on a GPU, done (synchronized) before another process may read them."""
        for index, offset, tensor, strides in self.copies:
            self.regions[index].view(offset, tensor.dtype, tuple(tensor.shape), strides).copy_(tensor)
        if self.cuda:
            load_torch().cuda.synchronize()

    def close(self) -> None:
        for r in self.regions:
            r.close()


def lend(inputs) -> LentInputs:
    """Fresh regions holding ``inputs`` (as make_inputs returned them): ``LentInputs`` filled at once."""
    staged = LentInputs(inputs)
    try:
        staged.fill()
    except BaseException:
        staged.close()
        raise
    return staged


def rebuild(tree: list, regions: list[Region]):
    """The input structure over this process's mapping of ``regions`` (the candidate's side)."""
    torch = load_torch()
    kind = tree[0]
    if kind == "T":
        _, index, offset, dtype, shape, strides = tree
        return regions[index].view(offset, getattr(torch, dtype), tuple(shape), tuple(strides) if strides else None)
    if kind == "U":
        return tuple(rebuild(x, regions) for x in tree[1])
    if kind == "L":
        return [rebuild(x, regions) for x in tree[1]]
    if kind == "D":
        return {k: rebuild(x, regions) for k, x in tree[1]}
    if kind == "V":
        return tree[1]
    if kind == "dtype":
        return getattr(torch, tree[1])
    if kind == "device":
        return torch.device(tree[1])
    raise ValueError(f"unknown input node {kind!r}")


def put_output(slot: Region | None, out, sync) -> dict:
    """Copy a call's output into the judge's slot (the candidate's side) and say where; or name what it returned
    instead of plain tensors. Copied without running the candidate's code: a tensor subclass is refused, a list or
    tuple subclass read through the base type's iterator (tensors.output_items)."""
    _, _, detach, tensor, no_torch_function = loaded()
    items = output_items(out)
    if not all(isinstance(t, tensor) for t in items):
        return {"other": type(out).__name__[:100]}
    odd = next((t for t in items if type(t) is not tensor), None)
    if odd is not None:
        return {"other": f"a {type(odd).__name__[:60]} (a torch.Tensor subclass: return plain tensors)"}
    odd = next((t for t in items if dtype_name(t.dtype) not in DTYPES or t.layout is not load_torch().strided), None)
    if odd is not None:
        return {"other": f"a {odd.layout} {odd.dtype} tensor"}
    placed, offset = [], 0
    for t in items:
        need = t.numel() * t.element_size()
        if slot is None or offset + need > slot.nbytes:
            return {"other": f"an output of {sum(x.numel() * x.element_size() for x in items)} bytes, more than the "
                             f"expected output's {slot.nbytes if slot else 0}"}
        placed.append([offset, dtype_name(t.dtype), list(t.shape)])
        with no_torch_function():  # a torch function mode the candidate entered would run here
            slot.view(offset, t.dtype, tuple(t.shape)).copy_(detach(t))
        offset = aligned(offset + need)
    sync()
    return {"tensors": placed, "tuple": isinstance(out, (list, tuple))}


def take_output(slot: Region, output: dict, sync):
    """The judge's own copy of an output the candidate's process described (``wire.parse_output``): a tensor, a
    tuple of them, or the name of what came instead (which compare.compare reports)."""
    torch = load_torch()
    if "other" in output:
        return output["other"]
    try:
        copies = [slot.view(offset, getattr(torch, dtype), shape).clone() for offset, dtype, shape in output["tensors"]]
    except ValueError as e:  # offsets or sizes outside the slot
        return f"an output described outside the harness's slot ({e})"
    sync()
    return tuple(copies) if output["tuple"] else copies[0]
