"""The Ray evaluation pool: each evaluation a Ray task holding one GPU (or one CPU without GPUs) on some node.

On the worker the evaluation runs exactly as on a local slot: a ``SubprocessEvaluator`` there starts the judge and
candidate processes with the same limits, scrubbed environment and sandbox, and makes its HMAC key itself, so no
secret leaves the search's machine. What travels (ray_shipping.py): this package and the libraries its worker side
imports, as Ray ``py_modules`` (a node needs only Ray and torch), the task folder with its data files (a tar archive,
put into Ray's object store once per task), the candidate's files and the evaluator's settings; the ``EvalResult``
comes back as JSON. ``close()`` removes the task copies on every node.

At most ``slots`` evaluations run at once (the cluster's GPUs of the pool's model, or ``--gpus N`` of them; its CPUs,
or ``--cpu-slots``): more would only queue inside Ray, where their wait would count against their timeout.

A worker or node that dies mid-evaluation (its process killed, the node lost) is tried once more (``RETRIES``) on a
worker that is alive, and the retry is recorded in the result's ``ray_retries``; a second death is an
``infrastructure_error`` (failures.py), which the search retries and never charges to the candidate
(infrastructure.py). The search records every attempt once, under its deterministic id, when the result comes back,
so a retried evaluation is neither lost nor recorded twice.

GPU models: a cluster whose GPU nodes report more than one accelerator type is refused unless ``gpu_model`` picks
one (Ray's ``accelerator_type``); every result records the model it ran on.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time
from pathlib import Path

from ksearch_graph.harness.parent import ray_shipping
from ksearch_graph.harness.parent.failures import infrastructure_error
from ksearch_graph.harness.parent.pool import Interval, PoolError, busy_share
from ksearch_graph.tasks.evaluation import EvalResult
from ksearch_graph.tasks.task import Task

RETRIES = 1  # a dead worker's evaluation runs once more elsewhere
CLEANUP_TIMEOUT_S = 60
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
CLIENT_ATTEMPTS = 3  # ray:// connections: a client server that died at its start is started again


class RayPool:
    def __init__(self, options: dict, settings: dict, slots: int, model: str, runtime_env: dict | None = None):
        self.options = options  # Ray resources per evaluation: {"num_gpus": 1, ...} or {"num_cpus": 1}
        self.settings = settings  # SubprocessEvaluator's keyword arguments, for the worker
        self.slots = slots
        self.model = model
        self.intervals: list[Interval] = []  # worker-side start and end of each evaluation (wall clock)
        self.started = time.time()
        self.runtime_env = runtime_env  # each task's runtime_env, where the job's does not carry the package
        self._bundles: dict[str, tuple[str, object]] = {}  # task root -> (digest, ObjectRef of the tar archive)
        self._lock = threading.Lock()
        self._running = threading.BoundedSemaphore(max(1, slots))
        self._remote = None
        self._job = None

    @classmethod
    def connect(cls, address: str | None, *, settings: dict, gpu_model: str | None = None,
                cpu_slots: int | None = None, gpus: int | None = None, lanes: int = 1) -> RayPool:
        """Join the Ray cluster at ``address`` ("auto", "ray://HOST:PORT", or a GCS "HOST:PORT"); None starts a local
        Ray (unless this process already joined one). ``gpus`` and ``cpu_slots`` cap the evaluations at once;
        ``lanes`` evaluations share a GPU (a fraction of it each, as Ray counts; gpu_share.py orders their timing)."""
        if lanes < 1:
            raise PoolError(f"--lanes-per-gpu must be at least 1, not {lanes}")
        try:
            import ray
        except ImportError:
            raise PoolError("Ray is not installed: pip install 'ksearch-graph[ray]'") from None
        task_env = None  # the package travels with the job (ray.init's runtime_env), so every task has it
        if not ray.is_initialized():
            client = bool(address and address.startswith("ray://"))
            # Ray Client forwards changed arguments to ray.init on the cluster, which refuses a dashboard setting
            # for a cluster that exists: only the logging ones go with it.
            kwargs = {"log_to_driver": False} if client else {
                "include_dashboard": False, "log_to_driver": False, "logging_level": "WARNING",
                "configure_logging": True}
            kwargs["runtime_env"] = ray_shipping.runtime_env()
            try:
                _init(ray, address, kwargs, attempts=CLIENT_ATTEMPTS if client else 1)
            except ImportError as e:  # ray:// without Ray Client's grpcio
                raise PoolError(f"cannot join the Ray cluster at {address}: {e} (pip install 'ksearch-graph[ray]' "
                                "brings Ray Client)") from None
            except (ConnectionError, ValueError, RuntimeError) as e:
                raise PoolError(f"cannot join the Ray cluster at {address}: {e}") from None
        else:  # the caller joined Ray itself: the package goes with each task instead
            task_env = ray_shipping.uploaded_runtime_env()
        resources = ray.cluster_resources()
        types = sorted(k.split(":", 1)[1] for k in resources if k.startswith("accelerator_type:"))
        cluster_gpus = int(resources.get("GPU", 0))
        if cluster_gpus:
            if gpu_model is None and len(types) > 1:
                raise PoolError(f"the Ray cluster has GPUs of {len(types)} models ({', '.join(types)}), and scores "
                                "measured on different models cannot be compared within one search: choose one "
                                "with --gpu-model " + types[0])
            if gpu_model is not None and gpu_model not in types:
                raise PoolError(f"--gpu-model {gpu_model}: the cluster has {', '.join(types) or 'no typed GPUs'}")
            options = {"num_gpus": 1 / lanes} | ({"accelerator_type": gpu_model} if gpu_model else {})
            model = gpu_model or (types[0] if types else "gpu")
            slots = int(resources.get(f"accelerator_type:{gpu_model}", cluster_gpus)) if gpu_model else cluster_gpus
            if gpus is not None:
                slots = min(slots, gpus)
            slots *= lanes
        else:
            if gpus is not None:
                raise PoolError(f"--gpus {gpus}: the Ray cluster has no GPUs (--cpu-slots caps CPU evaluations)")
            options, model = {"num_cpus": 1}, "cpu"
            slots = int(resources.get("CPU", 1))
            if cpu_slots is not None:
                slots = min(slots, cpu_slots)
        return cls(options, settings, max(1, slots), model, task_env)

    def evaluate(self, task: Task, files: dict[str, str], *, attempt_id: str) -> EvalResult:
        import ray

        try:
            digest, bundle = self._bundle(task)
        except OSError as e:  # a data file the task names is gone: the task's problem, on this machine
            return infrastructure_error("the task cannot be sent to the Ray cluster", str(e))
        lost: list[str] = []
        with self._running:
            while True:
                ref = self._remote_fn().options(**self.options, **self.task_options).remote(
                    bundle, digest, files, attempt_id, self.settings, self.job)
                try:
                    text, start, end = ray.get(ref)
                    break
                except ray.exceptions.RayTaskError as e:  # the harness itself raised on the worker (it should not)
                    return infrastructure_error("the evaluation failed on the Ray worker", plain(str(e)))
                except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                        ray.exceptions.RaySystemError, ray.exceptions.ObjectLostError,
                        ray.exceptions.RuntimeEnvSetupError) as e:
                    lost.append(f"{type(e).__name__}: {(plain(str(e)).strip().splitlines() or [''])[0][:300]}")
                    if len(lost) > RETRIES:
                        return infrastructure_error(f"the Ray worker was lost twice (retried {RETRIES}x)",
                                                    "; ".join(lost))
        with self._lock:
            self.intervals.append(Interval("ray", attempt_id, start, end))
        result = EvalResult.model_validate_json(text)
        if lost:
            result.environment["ray_retries"] = lost
        return result

    @property
    def task_options(self) -> dict:
        """What every task of this pool is given besides its resources: the package, where the job lacks it."""
        return {} if self.runtime_env is None else {"runtime_env": self.runtime_env}

    @property
    def job(self) -> str:
        """This search's Ray job id: the worker-side folder its task copies live in."""
        if self._job is None:
            import ray

            self._job = ray.get_runtime_context().get_job_id()
        return self._job

    def utilisation(self, since: float | None = None, until: float | None = None) -> float:
        with self._lock:
            intervals = list(self.intervals)
        return busy_share(intervals, self.slots, self.started if since is None else since,
                          time.time() if until is None else until)

    def close(self) -> None:
        """Remove this search's task copies on every alive node (the cluster outlives the search; a local Ray ends
        with this process). Best effort: a node that does not answer keeps its copy under task_copies()."""
        import ray

        if not ray.is_initialized() or not self._bundles:
            return
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        cleanup = ray.remote(num_cpus=0, max_retries=0)(ray_shipping.cleanup_on_node)
        refs = [cleanup.options(**self.task_options,
                                scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                .remote(self.job) for n in ray.nodes() if n.get("Alive")]
        try:
            ray.get(refs, timeout=CLEANUP_TIMEOUT_S)
        except ray.exceptions.RayError:
            pass

    def _remote_fn(self):
        import ray

        if self._remote is None:
            # max_calls=0: workers are reused (Ray's default for GPU tasks is a fresh worker per task, which costs a
            # process start per evaluation and loses the worker's reference timings); the GPU work runs in the
            # judge's processes, so a worker holds no GPU memory between tasks. max_retries=0: evaluate() retries,
            # and records it.
            self._remote = ray.remote(max_retries=0, retry_exceptions=False, max_calls=0)(evaluate_on_worker)
        return self._remote

    def _bundle(self, task: Task) -> tuple[str, object]:
        import ray

        with self._lock:
            if task.root not in self._bundles:
                data = ray_shipping.pack_task(Path(task.root))
                self._bundles[task.root] = (hashlib.sha256(data).hexdigest()[:16], ray.put(data))
            return self._bundles[task.root]


def plain(text: str) -> str:
    """Ray's error text without its terminal colours (they would be stored with the run and shown to people)."""
    return _ANSI.sub("", text)


def _init(ray, address: str | None, kwargs: dict, attempts: int) -> None:
    """ray.init, tried again where the cluster's Ray Client server failed to start this client's server process (it
    forks from a process with live gRPC threads, which now and then kills the child: see docs/scale-out.md)."""
    for attempt in range(attempts):
        try:
            ray.init(address=address, **kwargs)
            return
        except (ConnectionError, RuntimeError) as e:
            if attempt + 1 == attempts or "Starting Ray client server failed" not in str(e):
                raise
            time.sleep(2.0)


# ---------------------------------------------------------------------- on the worker

# Per worker process: one SubprocessEvaluator per settings, keeping its reference timings (per GPU). No processes
# started ahead: a reused worker may hold a different GPU for its next task.
_evaluators: dict = {}


def evaluate_on_worker(bundle: bytes, digest: str, files: dict[str, str], attempt_id: str,
                       settings: dict, job: str) -> tuple[str, float, float]:
    """Runs in a Ray worker: unpack the task once per node, evaluate like a local slot, return the result's JSON."""
    from ksearch_graph.harness.parent.client import SubprocessEvaluator
    from ksearch_graph.tasks.task import load_task

    start = time.time()
    task = load_task(ray_shipping.unpack_task(bundle, digest, job))
    key = repr(sorted(settings.items()))
    if key not in _evaluators:
        _evaluators[key] = SubprocessEvaluator(**(settings | {"prestart": False}))
    result = _evaluators[key].evaluate(task, files, attempt_id=attempt_id)
    import ray

    result.environment.update(gpu_model=result.environment.get("gpu") or "cpu",
                              ray_node=ray.get_runtime_context().get_node_id(),
                              cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
    return result.model_dump_json(), start, time.time()
