"""What a task needs of the machine, and whether this one has it: a task that cannot run here is ``unavailable``,
with the reason, never a task bug or a candidate's failure.

task.json ``"requires"`` (every key optional):

- ``"device": "cuda"``: a GPU; its inputs are made on "cuda" whatever device the harness asks for.
- ``"rocm": true``: an AMD GPU with ROCm (torch built for HIP).
- ``"compute_capability": [10, 0]``: at least this NVIDIA compute capability.
- ``"python_modules": ["aiter"]``: importable here (found, not imported).
- ``"why"``: what needs it, in words, added to the reason.
"""

from __future__ import annotations

import importlib.util

from ksearch_graph.harness._torch import load_torch

REQUIRE_KEYS = {"device": str, "rocm": bool, "compute_capability": list, "python_modules": list, "why": str}


def parse_requires(raw, where: str) -> dict:
    """task.json's "requires", validated."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: \"requires\" must be a mapping, got {str(raw)[:100]}")
    for key, value in raw.items():
        kind = REQUIRE_KEYS.get(key)
        if kind is None:
            raise ValueError(f"{where}: requires.{key} is not a requirement (known: {', '.join(REQUIRE_KEYS)})")
        if not isinstance(value, kind):
            raise ValueError(f"{where}: requires.{key} must be a {kind.__name__}, got {value!r}")
    if raw.get("device", "cuda") not in ("cuda", "cpu"):
        raise ValueError(f"{where}: requires.device must be \"cuda\" or \"cpu\", got {raw['device']!r}")
    cc = raw.get("compute_capability", [0, 0])
    if len(cc) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in cc):
        raise ValueError(f"{where}: requires.compute_capability must be [major, minor], got {cc!r}")
    if not all(isinstance(m, str) and m.isidentifier() for m in raw.get("python_modules", [])):
        raise ValueError(f"{where}: requires.python_modules must be top-level module names")
    return dict(raw)


def unmet_requirement(task: dict, device: str) -> str | None:
    """Why this machine cannot run the task (``device``: "cuda" or "cpu", the harness's), or None."""
    req = task.get("requires") or {}
    why = f" ({req['why']})" if req.get("why") else ""
    missing = [m for m in req.get("python_modules", []) if importlib.util.find_spec(m) is None]
    if missing:
        return (f"this task needs the Python module{'s' if len(missing) > 1 else ''} {', '.join(missing)}, which "
                f"{'are' if len(missing) > 1 else 'is'} not installed here{why}")
    wants_gpu = req.get("device") == "cuda" or req.get("rocm") or req.get("compute_capability")
    if wants_gpu and device != "cuda":
        return f"this task needs a GPU and this machine has none{why}"
    torch = load_torch()
    if req.get("rocm") and getattr(torch.version, "hip", None) is None:
        return f"this task needs an AMD GPU with ROCm; this one is {torch.cuda.get_device_name(0)}{why}"
    cc = req.get("compute_capability")
    if cc:
        have = torch.cuda.get_device_capability(0)
        if getattr(torch.version, "hip", None) is not None or tuple(have) < tuple(cc):
            return (f"this task needs an NVIDIA GPU of compute capability {cc[0]}.{cc[1]} or newer; this one, "
                    f"{torch.cuda.get_device_name(0)}, is {have[0]}.{have[1]}{why}")
    return None
