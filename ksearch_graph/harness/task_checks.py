"""A task's own correctness check, run by the judge in place of the elementwise comparison.

task.json ``"check": {"module": "reference.py", "function": "check_implementation"}`` names a file of the task folder
and a function in it: the user's trusted code (GPU MODE's ``check_implementation``), which the candidate never runs.
It is called as GPU MODE's eval.py calls it, ``function(*inputs, output)``: for a GPU MODE task the inputs are
``(data,)``, so it gets ``(data, output)``. Both are the judge's own copies: a clone of the inputs as make_inputs made
them (the problem's reference, which many checks call, may write into an output buffer among them) and a clone of the
output the candidate's process sent (nothing the candidate still holds).

Its verdict is read as eval.py reads it: a pair ``(passed, message)``, or one string, empty when it passed. A failed
verdict becomes ``incorrect_shape`` where the output's tensors differ from the reference's in number or shape, else
``incorrect_numerical``; the check's own message is kept. A check that raises is the candidate's failure where the
output's structure differs from the reference's (the check tripped over it), else a task bug (``runtime_error``).
"""

from __future__ import annotations

import os
import sys
import traceback

from ksearch_graph.harness._torch import load_torch
from ksearch_graph.harness.modules import load_module
from ksearch_graph.harness.tensors import as_tensors, clone

CHECK_KEYS = ("module", "function")
_loaded: dict[str, object] = {}  # absolute path -> module: each check file is imported once per process


def parse_check(raw, where: str) -> dict | None:
    """task.json's "check", validated: None, or {"module": a relative .py path, "function": a name}."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) != set(CHECK_KEYS) or not all(isinstance(raw[k], str) and raw[k]
                                                                          for k in CHECK_KEYS):
        raise ValueError(f"{where}: \"check\" must be {{\"module\": FILE.py, \"function\": NAME}}, got {raw!r}")
    module = raw["module"]
    if os.path.isabs(module) or ".." in module.replace("\\", "/").split("/") or not module.endswith(".py"):
        raise ValueError(f"{where}: check.module must be a .py file inside the task folder, got {module!r}")
    if not raw["function"].isidentifier():
        raise ValueError(f"{where}: check.function must be a Python name, got {raw['function']!r}")
    return dict(raw)


def load_check(task_dir: str, task: dict):
    """The task's check function, or None where the task has none. The module is imported once; where it is the
    file the judge already imported as the task's reference (``ksearch_reference``), that module is used."""
    check = task.get("check")
    if not check:
        return None
    path = os.path.realpath(os.path.join(task_dir, check["module"]))
    module = _loaded.get(path)
    if module is None:
        reference = sys.modules.get("ksearch_reference")
        if reference is not None and os.path.realpath(getattr(reference, "__file__", "") or "") == path:
            module = reference
        else:

            module = load_module(f"ksearch_check_{len(_loaded)}", path)
        _loaded[path] = module
    fn = getattr(module, check["function"], None)
    if not callable(fn):
        raise ValueError(f"the task's check {check['module']}:{check['function']} is not a function")
    return fn


def verdict(result) -> tuple[bool, str]:
    """(passed, message) from what a GPU MODE check returns: a pair, or one string that is empty when it passed."""
    if isinstance(result, tuple):
        if len(result) != 2:
            raise ValueError(f"returned a tuple of {len(result)} items, not (passed, message)")
        return bool(result[0]), str(result[1])
    return not bool(result), str(result)


def structure_differs(output, expected) -> str | None:
    """How the output's tensors differ from the reference's in number or shape, or None."""
    got, want = as_tensors(output) if not isinstance(output, str) else None, as_tensors(expected)
    if got is None:
        return f"returned {output if isinstance(output, str) else type(output).__name__}, not tensors"
    if want is None:
        return None
    if len(got) != len(want):
        return f"returned {len(got)} tensors, the reference {len(want)}"
    for k, (o, r) in enumerate(zip(got, want)):
        if tuple(o.shape) != tuple(r.shape):
            name = "output" if len(got) == 1 else f"output[{k}]"
            return f"{name} has shape {tuple(o.shape)}, the reference's {tuple(r.shape)}"
    return None


def run_check(task_dir: str, task: dict, inputs, output, expected) -> tuple[str | None, str]:
    """The task's check on one call: (failure status or None, message). ``inputs``: the judge's pristine inputs of
    the call (not changed here); ``output``: the output as the candidate's process sent it (a tensor, a tuple of
    tensors, or the name of what it returned instead); ``expected``: the reference's output."""
    torch = load_torch()
    fn = load_check(task_dir, task)
    if isinstance(output, str):  # the runner sends the type name of anything that is not tensors
        return "incorrect_shape", f"returned {output}, expected tensors as the reference returns"
    mine = clone(output)
    try:
        with torch.no_grad():
            passed, message = verdict(fn(*clone(tuple(inputs)), mine))
    except Exception as e:  # noqa: BLE001 (the check's own error, reported)
        where = "".join(traceback.format_exception_only(type(e), e)).strip()[-600:]
        differs = structure_differs(output, expected)
        if differs:
            return "incorrect_shape", f"{differs}; the task's check raised {where}"
        return "runtime_error", (f"the task's check {task['check']['module']}:{task['check']['function']} raised "
                                 f"{where} (a task bug, not the candidate's)")
    if passed:
        return None, message
    differs = structure_differs(output, expected)
    return ("incorrect_shape", f"{differs}: {message}") if differs else ("incorrect_numerical", message)
