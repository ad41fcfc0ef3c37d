"""The Ray evaluation pool: each evaluation a Ray task holding one GPU (or one CPU without GPUs) on some node.

On the worker the evaluation runs exactly as on a local slot: a ``SubprocessEvaluator`` there starts the judge and
candidate processes with the same limits, scrubbed environment and network isolation, and makes its HMAC key itself,
so no secret leaves the search's machine. What travels: the task folder (a tar archive, put into Ray's object store
once per task), the candidate's files and the evaluator's settings; the ``EvalResult`` comes back as JSON.

A worker or node that dies mid-evaluation (its process killed, the node lost) makes Ray run the task once more on a
worker that is alive (``max_retries=1``); a second death is an ``infrastructure_error`` (failures.py), which the
search retries and never charges to the candidate (infrastructure.py). The search records every attempt once,
under its deterministic id, when the result comes back, so a retried evaluation is neither lost nor recorded twice.

GPU models: a cluster whose GPU nodes report more than one accelerator type is refused unless ``gpu_model`` picks
one (Ray's ``accelerator_type``); every result records the model it ran on.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tarfile
import tempfile
import threading
import time
from pathlib import Path

from ..evaluation import EvalResult
from ..task import Task
from .failures import infrastructure_error
from .pool import Interval, PoolError, busy_share

RETRIES = 1  # a dead worker's evaluation runs once more elsewhere


class RayPool:
    def __init__(self, options: dict, settings: dict, slots: int, model: str):
        self.options = options  # Ray resources per evaluation: {"num_gpus": 1, ...} or {"num_cpus": 1}
        self.settings = settings  # SubprocessEvaluator's keyword arguments, for the worker
        self.slots = slots
        self.model = model
        self.intervals: list[Interval] = []  # worker-side start and end of each evaluation (wall clock)
        self.started = time.time()
        self._bundles: dict[str, tuple[str, object]] = {}  # task root -> (digest, ObjectRef of the tar archive)
        self._lock = threading.Lock()
        self._remote = None

    @classmethod
    def connect(cls, address: str | None, *, settings: dict, gpu_model: str | None = None,
                cpu_slots: int | None = None) -> "RayPool":
        """Join the Ray cluster at ``address`` ("auto", "ray://HOST:PORT", or a GCS "HOST:PORT"); None starts a local
        Ray (unless this process already joined one)."""
        try:
            import ray
        except ImportError:
            raise PoolError("Ray is not installed: pip install 'ksearch-graph[ray]'") from None
        if not ray.is_initialized():
            try:
                ray.init(address=address, include_dashboard=False, log_to_driver=False,
                         logging_level="WARNING", configure_logging=True)
            except (ConnectionError, ValueError, RuntimeError) as e:
                raise PoolError(f"cannot join the Ray cluster at {address}: {e}") from None
        resources = ray.cluster_resources()
        types = sorted(k.split(":", 1)[1] for k in resources if k.startswith("accelerator_type:"))
        gpus = int(resources.get("GPU", 0))
        if gpus:
            if gpu_model is None and len(types) > 1:
                raise PoolError(f"the Ray cluster has GPUs of {len(types)} models ({', '.join(types)}), and scores "
                                "measured on different models cannot be compared within one search: choose one "
                                "with --gpu-model " + types[0])
            if gpu_model is not None and gpu_model not in types:
                raise PoolError(f"--gpu-model {gpu_model}: the cluster has {', '.join(types) or 'no typed GPUs'}")
            options = {"num_gpus": 1} | ({"accelerator_type": gpu_model} if gpu_model else {})
            model = gpu_model or (types[0] if types else "gpu")
            slots = int(resources.get(f"accelerator_type:{gpu_model}", gpus)) if gpu_model else gpus
        else:
            options, model = {"num_cpus": 1}, "cpu"
            slots = int(resources.get("CPU", 1))
        if cpu_slots is not None and not gpus:
            slots = min(slots, cpu_slots)
        return cls(options, settings, max(1, slots), model)

    def evaluate(self, task: Task, files: dict[str, str], *, attempt_id: str) -> EvalResult:
        import ray

        digest, bundle = self._bundle(task)
        ref = self._remote_fn().options(**self.options).remote(bundle, digest, files, attempt_id, self.settings)
        try:
            text, start, end = ray.get(ref)
        except ray.exceptions.RayTaskError as e:  # the harness itself raised on the worker (it should not)
            return infrastructure_error("the evaluation failed on the Ray worker", str(e))
        except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError, ray.exceptions.RaySystemError,
                ray.exceptions.ObjectLostError) as e:
            return infrastructure_error(f"the Ray worker was lost twice (retried {RETRIES}x)", f"{type(e).__name__}: {e}")
        with self._lock:
            self.intervals.append(Interval("ray", attempt_id, start, end))
        return EvalResult.model_validate_json(text)

    def utilisation(self, since: float | None = None, until: float | None = None) -> float:
        with self._lock:
            intervals = list(self.intervals)
        return busy_share(intervals, self.slots, self.started if since is None else since,
                          time.time() if until is None else until)

    def close(self) -> None:
        pass  # the cluster outlives the search; a local Ray ends with this process

    def _remote_fn(self):
        import ray

        if self._remote is None:
            # max_calls=0: workers are reused (Ray's default for GPU tasks is a fresh worker per task, which costs a
            # process start per evaluation and loses the worker's reference timings); the GPU work runs in the
            # judge's processes, so a worker holds no GPU memory between tasks.
            self._remote = ray.remote(max_retries=RETRIES, retry_exceptions=False, max_calls=0)(evaluate_on_worker)
        return self._remote

    def _bundle(self, task: Task) -> tuple[str, object]:
        import ray

        with self._lock:
            if task.root not in self._bundles:
                data = pack_folder(Path(task.root))
                self._bundles[task.root] = (hashlib.sha256(data).hexdigest()[:16], ray.put(data))
            return self._bundles[task.root]


def pack_folder(folder: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(folder, arcname="task", filter=lambda info: None if "__pycache__" in info.name else info)
    return buf.getvalue()


# ---------------------------------------------------------------------- on the worker

# Per worker process: one SubprocessEvaluator per settings, keeping its reference timings (per GPU). No processes
# started ahead: a reused worker may hold a different GPU for its next task.
_evaluators: dict = {}


def evaluate_on_worker(bundle: bytes, digest: str, files: dict[str, str], attempt_id: str,
                       settings: dict) -> tuple[str, float, float]:
    """Runs in a Ray worker: unpack the task once per node, evaluate like a local slot, return the result's JSON."""
    from .client import SubprocessEvaluator
    from ..task import load_task

    start = time.time()
    task = load_task(_unpacked(bundle, digest))
    key = repr(sorted(settings.items()))
    if key not in _evaluators:
        _evaluators[key] = SubprocessEvaluator(**(settings | {"prestart": False}))
    result = _evaluators[key].evaluate(task, files, attempt_id=attempt_id)
    import ray

    result.environment.update(gpu_model=result.environment.get("gpu") or "cpu",
                              ray_node=ray.get_runtime_context().get_node_id(),
                              cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
    return result.model_dump_json(), start, time.time()


def _unpacked(bundle: bytes, digest: str) -> Path:
    """The task folder on this node, unpacked once per content digest (renamed into place: never half there)."""
    base = Path(tempfile.gettempdir()) / "ksearch-ray-tasks"
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
