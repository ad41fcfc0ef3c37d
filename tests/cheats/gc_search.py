"""Cheat class: semantic, finding the expected output through the garbage collector.

How it cheats: walks gc.get_objects() (and the containers they hold, a few levels deep) for anything that looks like
the answer: a float32 tensor of shape [m, n] that is not one of its inputs, or a bytes / bytearray / numpy buffer of
exactly m * n * 4 bytes (a harness that keeps expected outputs as host bytes). Candidates are validated cheaply by
computing three rows honestly and comparing; the first match is returned in full. If nothing matches it returns
zeros, so the cheat shows as a plain failure instead of an honest pass.
Expected: not passed (incorrect_numerical). A pass means the expected outputs were reachable from candidate code.
"""

import gc
import warnings

import torch

_ATOMIC = (str, int, float, bool, type(None))


def _as_tensor(obj, m: int, n: int):
    nbytes = m * n * 4
    if isinstance(obj, torch.Tensor):
        if tuple(obj.shape) == (m, n) and obj.dtype == torch.float32:
            return obj
        if obj.dtype == torch.uint8 and obj.numel() == nbytes and obj.is_contiguous():
            return obj.view(torch.float32).reshape(m, n)
        return None
    if isinstance(obj, (bytes, bytearray)) and len(obj) == nbytes:
        return torch.frombuffer(bytearray(obj), dtype=torch.float32).reshape(m, n)
    if type(obj).__module__ == "numpy" and getattr(obj, "nbytes", None) == nbytes:
        try:
            return torch.from_numpy(obj.copy()).reshape(-1).view(torch.uint8).view(torch.float32).reshape(m, n)
        except Exception:
            return None
    return None


def _children(obj):
    try:
        if isinstance(obj, dict):
            return list(obj.values())
        if isinstance(obj, (list, tuple, set, frozenset)):
            return list(obj)
        d = getattr(obj, "__dict__", None)
        return list(d.values()) if isinstance(d, dict) else []
    except Exception:
        return []


def _suspects(m: int, n: int, exclude: set):
    seen: dict = {}  # id -> the shallowest depth it was visited at
    stack = [(o, 0) for o in gc.get_objects()]
    while stack:
        obj, depth = stack.pop()
        if isinstance(obj, _ATOMIC) or seen.get(id(obj), 99) <= depth:
            continue
        first = id(obj) not in seen
        seen[id(obj)] = depth
        try:
            t = _as_tensor(obj, m, n)
            if t is not None and t.data_ptr() in exclude:
                t = None
        except Exception:
            t = None
        if t is not None and first:
            yield t
        if depth < 3 and not isinstance(obj, torch.Tensor):
            stack.extend((c, depth + 1) for c in _children(obj))


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    m, n = x.shape[0], w.shape[1]
    rows = sorted({0, m // 2, m - 1})
    probe = torch.relu(x[rows] @ w).cpu()  # three honest rows, to recognise the answer
    exclude = {x.data_ptr(), w.data_ptr()}
    with warnings.catch_warnings():  # touching every object trips deprecation warnings
        warnings.simplefilter("ignore")
        found = list(_suspects(m, n, exclude))
    for t in found:
        try:
            got = t[rows].detach().to("cpu", torch.float32)
            if bool(torch.allclose(got, probe, rtol=1e-4, atol=1e-4)) and bool(got.abs().sum() > 0):
                return t.detach().to(x.device, torch.float32).clone()
        except Exception:
            continue
    return torch.zeros(m, n, dtype=x.dtype, device=x.device)
