"""Crash class: a huge host allocation.

How it crashes: allocates host memory in 512 MiB chunks and touches every page (so the memory is really used, not just
reserved), aiming at twice the machine's RAM, capped at CAP_GIB so that a harness with no memory limit at all does
not take the test machine down with it. A harness must stop it at its own memory limit (the suite runs it with
memory_limit_gb=4) instead of letting the kernel's OOM killer pick a victim. If every chunk is granted, it returns
an honest result, which the suite reports as a missing limit.
Expected: runtime_error (e.g. MemoryError / out of memory, or killed by the harness), never passed.
"""

import torch

CHUNK = 512 << 20
CAP_GIB = 12

_hoard: list = []


def _ram_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 64 << 30


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    target = min(2 * _ram_bytes(), CAP_GIB << 30)
    while len(_hoard) * CHUNK < target:
        _hoard.append(torch.ones(CHUNK, dtype=torch.uint8))  # ones: every page written
    return torch.relu(x @ w)
