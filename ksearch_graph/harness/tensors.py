"""Tensors and nested values (tuples, lists and dicts of tensors and plain values): copies, snapshots of outputs,
content fingerprints, sizes."""

from __future__ import annotations

import copy

from ksearch_graph.harness._torch import load_torch, loaded

SMALL_BLOCK_BYTES = 1 << 20  # torch's caching allocator serves requests up to 1 MB from its small pool (2 MB segments)


def clone(value):
    torch = load_torch()
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(clone(v) for v in value)
    if isinstance(value, dict):
        return type(value)((k, clone(v)) for k, v in value.items())
    return copy.deepcopy(value)


def as_tensors(value) -> list | None:
    """A tensor or a tuple/list of tensors as a list; None for anything else."""
    torch = load_torch()
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
    torch = load_torch()
    out, sums = [], []
    for t in leaves(value):
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

    Two reads of the tensor and an int64 copy, cheaper than value sums over a float64 copy: a power-limited workload
    pays this time again in fillers (docs/timing.md, "Other costs measured")."""
    torch = load_torch()
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


def leaves(value):
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from leaves(v)
    elif isinstance(value, dict):
        for k in value:
            yield from leaves(value[k])
    else:
        yield value



# Keys a candidate adds to its input dicts (a prepared-weights cache: weights["_cache"] = ...) change no input: they
# are taken off the inputs sent back to the judge and named in the call's flags. A key removed, or a value replaced or
# changed, still reaches the judge's check (compare.same) and fails there.
def key_skeleton(value):
    """The dict keys of an input structure, taken before the candidate's call (plain dicts, lists and tuples)."""
    if type(value) is dict:
        return {k: key_skeleton(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return [key_skeleton(v) for v in value]
    return None


def without_added_keys(value, skeleton, added: list, path: str = "inputs"):
    """``value`` rebuilt without the dict keys ``skeleton`` lacks (the live structure is left as it is); their paths
    go to ``added``."""
    if type(value) is dict and isinstance(skeleton, dict):
        added += [f"{path}[{k!r}]"[:120] for k in value if k not in skeleton]
        return {k: without_added_keys(v, skeleton[k], added, f"{path}[{k!r}]") for k, v in value.items()
                if k in skeleton}
    if type(value) in (list, tuple) and isinstance(skeleton, list) and len(value) == len(skeleton):
        return type(value)(without_added_keys(v, s, added, f"{path}[{i}]")
                           for i, (v, s) in enumerate(zip(value, skeleton)))
    return value


def small_block_sizes(values) -> list[int]:
    """Bytes of the allocations behind the CUDA tensors among ``values`` that torch's caching allocator serves from
    its small pool (a view's is its storage's; a sparse tensor has none of its own)."""
    torch = load_torch()
    tensor = loaded().Tensor
    sizes = [t.untyped_storage().nbytes() for t in values
             if type(t) is tensor and t.is_cuda and t.layout is torch.strided]
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
    _, clone_, detach, tensor, no_torch_function = loaded()
    items = output_items(out)
    if not all(isinstance(t, tensor) for t in items):
        return type(out).__name__
    odd = next((t for t in items if type(t) is not tensor), None)
    if odd is not None:
        return f"a {type(odd).__name__} (a torch.Tensor subclass: return plain tensors)"
    with no_torch_function():  # a torch function mode the candidate entered would run here
        copies = [clone_(detach(t)) for t in items]
    sync()
    return tuple(copies) if isinstance(out, (list, tuple)) else copies[0]



def nbytes(value) -> int:
    torch = load_torch()
    return sum(t.numel() * t.element_size() for t in leaves(value) if isinstance(t, torch.Tensor))

