"""torch, imported on first use and only then: the candidate's process leaves its network namespace first (``unshare``
refuses a process with threads), and the judge starts the candidate's process before its own import (both overlap)."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple


class Loaded(NamedTuple):
    """torch, and what copies outputs (``tensors.snapshot``), bound at the import, before any candidate code runs: a
    candidate that replaces torch.Tensor.clone could finish its output inside the copy (tests/cheats/patch_clone.py)."""

    torch: Any
    clone: Any
    detach: Any
    Tensor: Any
    no_torch_function: Any


@functools.cache
def loaded() -> Loaded:
    import torch
    import torch.multiprocessing  # noqa: F401  (registers the IPC reductions on ForkingPickler)

    return Loaded(torch, torch.Tensor.clone, torch.Tensor.detach, torch.Tensor, torch._C.DisableTorchFunction)


def load_torch():
    """The torch module (imported at the first call)."""
    return loaded().torch
