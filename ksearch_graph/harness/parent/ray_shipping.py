"""What travels to a Ray worker, so that a node needs only Ray and torch: this package and the libraries its worker
side imports (``runtime_env``), and the task folder with the data files it names outside itself (``pack_task``).

The package goes as Ray ``py_modules``: Ray uploads each module once per content (its URI is a hash of it), puts it on
the worker's PYTHONPATH ahead of anything installed there (the judge and candidate processes inherit that path), and
reuses workers of the same runtime environment, so a search pays the upload once. What the worker side imports beyond
the standard library, Ray and torch is pydantic with its helpers (``SHIPPED``); pydantic_core is a compiled module
of this Python and platform, which Ray already requires every node to share (the same Python and Ray versions).

The task goes as a gzipped tar archive in Ray's object store, unpacked once per node and content under
``task_copies()/<job>/``, which ``cleanup_on_node`` removes when the search ends.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import io
import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

# This package, then what its worker side imports that neither Ray nor torch brings (measured: the modules a fresh
# interpreter gains from importing harness.client, task and ray_pool). typing_extensions is torch's too: the copy
# shipped is this side's, which pydantic was installed against.
SHIPPED = ("ksearch_graph", "pydantic", "pydantic_core", "annotated_types", "typing_extensions", "typing_inspection")
EXCLUDES = ["__pycache__", "*.pyc"]
DATA_FOLDER = "data"  # inside the archived task: the data files that lived outside the task folder


def runtime_env() -> dict:
    """Ray's runtime environment for every evaluation and probe: the modules of SHIPPED that this side has."""
    paths = []
    for name in SHIPPED:
        try:
            module = importlib.import_module(name)
        except ImportError:  # an older pydantic without typing_inspection: it does not need it either
            continue
        # A package's folder, or a one-file module's file (a task's runtime_env takes paths, not module objects).
        paths.append(module.__path__[0] if hasattr(module, "__path__") else module.__file__)
    return {"py_modules": paths, "excludes": list(EXCLUDES)}


def uploaded_runtime_env() -> dict | None:
    """``runtime_env()`` uploaded to the cluster this process joined, for a task's own runtime_env (Ray takes local
    folders only in ray.init's). None where the upload fails (a Ray Client connection made by the caller): the
    preflight then finds the package missing on the nodes and says so."""
    try:
        from ray._private.runtime_env.py_modules import upload_py_modules_if_needed

        env = upload_py_modules_if_needed(runtime_env(), include_gitignore=True, scratch_dir=tempfile.gettempdir())
    except Exception:  # noqa: BLE001 - Ray's internal helper: any failure means no shipping, reported at preflight
        return None
    env.pop("excludes", None)
    return env


@functools.cache
def package_digest() -> str:
    """A hash of this package's source files, which the preflight compares on each node with the driver's: the code
    the workers run is the code the search was started with."""
    root = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


# ---------------------------------------------------------------------------------------------------- the task


def _data_sources(spec: dict):
    """Each workload input of task.json that names a file (``{"type": "safetensors", "path": ...}``), as the dict
    to read or rewrite."""
    for workload in spec.get("workloads") or []:
        for source in ((workload.get("params") or {}).get("inputs") or {}).values():
            if isinstance(source, dict) and isinstance(source.get("path"), str):
                yield source


def external_data_files(folder: Path) -> list[str]:
    """Absolute paths outside ``folder`` that its task.json names as workload data (a FlashInfer-Trace workload's
    safetensors inputs), each once, in the order met."""
    paths = [s["path"] for s in _data_sources(_task_json(folder))]
    return list(dict.fromkeys(p for p in paths if os.path.isabs(p) and not _inside(p, folder)))


def pack_task(folder: Path) -> bytes:
    """The task folder as a gzipped tar archive (rooted at ``task/``), with the data files its task.json names outside
    it carried under ``task/data/`` and task.json rewritten to name them there (relative to the task folder, which the
    reference resolves them against). A missing data file raises FileNotFoundError naming it."""
    folder = Path(folder)
    external = external_data_files(folder)
    moved = {path: f"{DATA_FOLDER}/{i}-{os.path.basename(path)}" for i, path in enumerate(external)}
    missing = [p for p in external if not os.path.isfile(p)]
    if missing:
        raise FileNotFoundError(f"the task's data file {missing[0]} does not exist on this machine"
                                + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(folder, arcname="task", filter=lambda info: None if "__pycache__" in info.name or (
            moved and info.name == "task/task.json") else info)
        if moved:
            spec = _task_json(folder)
            for source in _data_sources(spec):
                source["path"] = moved.get(source["path"], source["path"])
            _add_bytes(tar, "task/task.json", (json.dumps(spec, indent=2) + "\n").encode())
            for path, name in moved.items():
                tar.add(path, arcname=f"task/{name}")
    return buf.getvalue()


def task_copies() -> Path:
    """Where workers unpack tasks on their node."""
    return Path(tempfile.gettempdir()) / "ksearch-ray-tasks"


def unpack_task(bundle: bytes, digest: str, job: str) -> Path:
    """The task folder on this node for ``job`` (the search's Ray job), unpacked once per content digest (renamed
    into place: never half there)."""
    base = task_copies() / job
    target = base / digest / "task"
    if target.is_dir():
        return target
    base.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{digest}-", dir=base))
    with tarfile.open(fileobj=io.BytesIO(bundle), mode="r:gz") as tar:
        tar.extractall(staging, filter="data")
    try:
        os.rename(staging, base / digest)
    except OSError:  # another worker was quicker
        shutil.rmtree(staging, ignore_errors=True)
    return target


def cleanup_on_node(job: str) -> bool:
    """Remove this node's copies of the job's tasks; True if there were any."""
    folder = task_copies() / job
    existed = folder.is_dir()
    shutil.rmtree(folder, ignore_errors=True)
    return existed


def _task_json(folder: Path) -> dict:
    try:
        spec = json.loads((folder / "task.json").read_text())
    except (OSError, ValueError):
        return {}
    return spec if isinstance(spec, dict) else {}


def _inside(path: str, folder: Path) -> bool:
    try:
        Path(os.path.realpath(path)).relative_to(folder.resolve())
        return True
    except ValueError:
        return False


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))
