"""What ``ksearch run TASK`` accepts, by kind: our task folder, a FlashInfer-Trace definition (or dataset root with a
definition name), a KernelBench problem file, a GPU MODE problem folder; finding the problems under a folder; and, for
each kind, the candidate that is the problem's own reference (tools/task_coverage.py evaluates it)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from ksearch_graph.tasks.flashinfer_trace import is_dataset_root, is_definition_file
from ksearch_graph.tasks.task import TaskError

Kind = Literal["task", "flashinfer", "kernelbench", "gpumode"]
SKIPPED_DIRS = {".git", "__pycache__", ".venv", "node_modules", "runs"}


def kind_of(path: Path, definition: str | None = None) -> Kind | None:
    """The kind of task source ``path`` is, or None."""
    from ksearch_graph.tasks.gpumode import is_problem_dir
    from ksearch_graph.tasks.kernelbench import is_problem_file

    if (path / "task.json").is_file() or path.name == "task.json":
        return "task"
    if is_dataset_root(path) or is_definition_file(path):
        return "flashinfer"
    if is_problem_dir(path):
        return "gpumode"
    if is_problem_file(path) and not definition:
        return "kernelbench"
    return None


def materialise(path: Path, out_dir: Path, definition: str | None = None) -> Path:
    """The task folder for a task source: ``path`` itself for a task folder, else one written into ``out_dir``."""
    from ksearch_graph.tasks.flashinfer_trace_task import materialise_definition
    from ksearch_graph.tasks.gpumode import materialise_gpumode
    from ksearch_graph.tasks.kernelbench import materialise_problem

    if not path.exists():
        raise TaskError(f"{path} does not exist")
    if definition and not (is_dataset_root(path) or is_definition_file(path)):
        raise TaskError(f"--definition is for a FlashInfer-Trace dataset root (a folder with definitions/), "
                        f"and {path} is not one")
    kind = kind_of(path, definition)
    if kind == "task":
        return path.parent if path.is_file() else path
    if kind == "flashinfer":
        return materialise_definition(path, out_dir, definition=definition)
    if kind == "kernelbench":
        return materialise_problem(path, out_dir)
    if kind == "gpumode":
        return materialise_gpumode(path, out_dir)
    raise TaskError(f"{path} is not a task: expected a task folder (with task.json), a FlashInfer-Trace definition "
                    "(.json) or dataset root (with --definition NAME), a KernelBench problem (.py), or a GPU MODE "
                    "problem folder (with task.yml and reference.py)")


def _looks_like_kernelbench(path: Path) -> bool:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return False
    return "class Model" in text and "def get_inputs" in text and "def get_init_inputs" in text


def discover(root: Path) -> Iterator[tuple[Kind, Path]]:
    """Every task source at or under ``root``, in path order: task folders, GPU MODE problem folders (task.yml),
    FlashInfer-Trace definitions (definitions/**.json of a dataset), KernelBench problems (.py with Model,
    get_inputs, get_init_inputs). A file is taken as it is."""
    root = Path(root)
    if root.is_file():
        kind = "kernelbench" if root.suffix == ".py" else kind_of(root)
        if kind:
            yield kind, root
        return
    if (root / "task.json").is_file():
        yield "task", root
        return
    if (root / "task.yml").is_file():
        yield "gpumode", root
        return
    if is_dataset_root(root):
        for path in sorted((root / "definitions").rglob("*.json")):
            if is_definition_file(path):
                yield "flashinfer", path
        return
    for child in sorted(root.iterdir()):
        if child.name in SKIPPED_DIRS or child.name.startswith("."):
            continue
        if child.is_dir():
            yield from discover(child)
        elif child.suffix == ".py" and _looks_like_kernelbench(child):
            yield "kernelbench", child


def reference_candidate(kind: Kind, task_dir: Path) -> dict[str, str]:
    """The files of a candidate that is the problem's own reference, for a task made from a source of ``kind``."""
    spec = json.loads((task_dir / "task.json").read_text())
    if kind == "gpumode":
        return {spec["solution_file"]: "from reference import ref_kernel  # the problem's reference.py\n\n\n"
                                       "def custom_kernel(data):\n    return ref_kernel(data)\n"}
    if kind == "kernelbench":
        return {spec["solution_file"]: (task_dir / spec["seed_solution"]).read_text()}
    if kind == "flashinfer":
        source = (task_dir / spec["reference"]).read_text()
        # the definition's run (at the top level, or in its own namespace), its outputs as the harness compares them
        return {spec["solution_file"]: source + "\n\n_ksearch_definition_run = globals().get('run') or "
                                                "_ksearch_namespace['run']\n\n\ndef run(*inputs):\n"
                                                "    return _ksearch_outputs(_ksearch_definition_run(*inputs))\n"}
    raise TaskError(f"no reference candidate for a {kind} source")
