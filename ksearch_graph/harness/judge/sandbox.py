"""The candidate's process in an OS sandbox (bubblewrap): what it sees, what it may write, what it may reach.

Inside: a read-only view of the system (/usr and its links, a few files of /etc), of the Python environment the judge
runs (its prefixes and import path; of this checkout only the ``ksearch_graph`` package), its own candidate folder
and compile cache (writable), a private /tmp and an empty HOME, /dev with only the basic nodes and the GPU's, a /proc
of its own PID namespace (neither the judge nor other evaluations are visible), /sys read-only, no network, no
capabilities, a new session, and death with its parent. The environment is an allow-list (``ALLOWED_ENV``): a
credential in any other variable never reaches it. docs/threat-model.md, "The sandbox", says why each part is there.

``--sandbox none`` (``Sandbox(None)``) runs the candidate's process without it, as a plain child: only for hosts
without bubblewrap, and every result says so (``isolation``).
"""

from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess
import sys

BWRAP_ENV = "KSEARCH_BWRAP"  # a bwrap binary to use instead of the one on PATH (e.g. unpacked from a .deb)
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: `sudo apt-get install bubblewrap`; Fedora: `sudo dnf install "
                "bubblewrap`), or set KSEARCH_BWRAP to a bwrap binary; `--sandbox none` runs candidates without it "
                "(they can then read your files and credentials)")

# The system, read-only: each is bound where it is a folder and re-made where it is a link (merged /usr).
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Of /etc only what a Python, a compiler and the CUDA driver read: no credentials, keys or host configuration.
ETC = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/passwd",
       "/etc/group", "/etc/nsswitch.conf", "/etc/localtime", "/etc/os-release", "/etc/nvidia")
# Variables passed in, by exact name or (names ending in "_") by prefix; every other variable is dropped.
ALLOWED_ENV = ("LANG", "LC_", "TZ", "TERM", "CUDA_", "NVIDIA_", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
               "NVSHMEM_DISABLE_NVLS", "TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "TRITON_LIBCUDA_PATH", "TRITON_PTXAS_PATH",
               "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "LD_LIBRARY_PATH", "CC", "CXX")
HOME = "/tmp/home"  # inside: empty, writable, gone with the sandbox
CACHE = "/ksearch-cache"  # inside: this evaluation's compile cache (Triton, CuPy, torch extensions)
HARNESS_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # holds ksearch_graph/


def bwrap_path() -> str | None:
    return os.environ.get(BWRAP_ENV) or shutil.which("bwrap")


@functools.cache
def unavailable_reason() -> str | None:
    """Why no sandbox can be made on this host (no bwrap, or user namespaces refused), or None."""
    bwrap = bwrap_path()
    if not bwrap:
        return f"bubblewrap (bwrap) is not installed: {INSTALL_HINT}"
    try:
        done = subprocess.run([bwrap, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "true"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bubblewrap ({bwrap}) does not run: {e}; {INSTALL_HINT}"
    if done.returncode != 0:
        return (f"bubblewrap ({bwrap}) cannot make a sandbox here: {done.stderr.strip()[:300]} (user namespaces "
                "may be off: sysctl kernel.unprivileged_userns_clone=1 or user.max_user_namespaces)")
    return None


def allowed_env(env: dict[str, str]) -> dict[str, str]:
    """The variables of ``env`` the allow-list keeps."""
    return {k: v for k, v in env.items()
            if any(k.startswith(name) if name.endswith("_") else k == name for name in ALLOWED_ENV)}


def python_paths() -> list[str]:
    """What the Python environment needs read-only: its prefixes and every folder on its import path; of this
    checkout (when it is on the path, as an editable install puts it) only the ksearch_graph package."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    for entry in sys.path:
        if entry and os.path.isdir(entry):
            paths.add(os.path.realpath(entry) if os.path.islink(entry) else os.path.abspath(entry))
    root = os.path.realpath(HARNESS_ROOT)
    out = {os.path.join(root, "ksearch_graph") if os.path.realpath(p) == root else p for p in paths}
    out.add(os.path.join(root, "ksearch_graph"))
    for folder in [p for p in paths if os.path.realpath(p) != root]:
        out |= {t for t in _link_targets(folder) if not any(_inside(t, p) for p in out)}
    return sorted(p for p in out if not _under_system(p))


def _link_targets(folder: str) -> set[str]:
    """Where the links directly inside ``folder`` point: an environment assembled from links (uv's
    ``--link-mode=symlink``, a Nix profile) keeps its packages elsewhere, and a bound folder of dangling links
    imports nothing. Links deeper inside a package are not followed, and none to a folder that holds the user's home
    (binding it would show the whole home)."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return set()
    home = os.path.realpath(os.path.expanduser("~"))
    targets = {os.path.realpath(e.path) for e in entries if e.is_symlink() and os.path.exists(e.path)}
    return {t for t in targets if not _inside(home, t)}


def import_path() -> list[str]:
    """PYTHONPATH inside: the judge's import path (site-packages of a venv, a user site, .pth entries), so the
    candidate's Python finds what the judge's does without reading any of HOME."""
    return [os.path.abspath(p) for p in sys.path if p and os.path.isdir(p)]


def _inside(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or lies under it."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _under_system(path: str) -> bool:
    return _inside(path, "/usr")


def gpu_devices() -> list[str]:
    """The GPU's device nodes (NVIDIA: /dev/nvidia*, /dev/nvidia-caps; AMD: /dev/kfd, /dev/dri)."""
    return sorted(set(glob.glob("/dev/nvidia*")) | {p for p in ("/dev/kfd", "/dev/dri") if os.path.exists(p)})


class Sandbox:
    """How the candidate's process is started: ``Sandbox("bwrap")`` inside bubblewrap, ``Sandbox(None)`` without.
    ``isolation`` names it for the result."""

    def __init__(self, kind: str | None = "bwrap"):
        if kind not in ("bwrap", None):
            raise ValueError(f"unknown sandbox {kind!r} (bwrap or none)")
        self.kind = kind
        self.bwrap = bwrap_path() if kind else None

    @property
    def isolation(self) -> str:
        if self.kind is None:
            return "none (--sandbox none): the candidate's process ran as the user, with the user's files"
        return "bwrap: own user, PID, network, IPC and mount namespaces; read-only system; no capabilities"

    def command(self, argv: list[str], *, candidate: str, cache: str, env: dict[str, str],
                extra_env: dict[str, str], ro_paths: tuple[str, ...] = ()) -> tuple[list[str], dict[str, str]]:
        """(command, environment) that runs ``argv`` in the sandbox: ``candidate`` and ``cache`` writable (the cache
        appears at CACHE), ``env`` filtered by ALLOWED_ENV, ``extra_env`` set as given (the harness's own),
        ``ro_paths`` read-only too."""
        inner_env = allowed_env(env) | {"HOME": HOME, "TMPDIR": "/tmp", "PYTHONNOUSERSITE": "1",
                                        "PYTHONDONTWRITEBYTECODE": "1",
                                        "PYTHONPATH": os.pathsep.join(import_path()),
                                        "PATH": os.pathsep.join(_bin_dirs(env.get("PATH", "")))} | extra_env
        if self.kind is None:
            return argv, inner_env | {"HOME": env.get("HOME", HOME), "TMPDIR": env.get("TMPDIR", "/tmp"),
                                      "TRITON_CACHE_DIR": os.path.join(cache, "triton"),
                                      "CUPY_CACHE_DIR": os.path.join(cache, "cupy"),
                                      "TORCH_EXTENSIONS_DIR": os.path.join(cache, "torch-extensions")}
        cmd = [self.bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
               "--hostname", "sandbox", "--clearenv"]
        for path in SYSTEM:
            if os.path.islink(path):
                cmd += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                cmd += ["--ro-bind", path, path]
        for path in ETC:
            cmd += ["--ro-bind-try", path, path]
        # The private /tmp first: a mount made before it would be hidden beneath it (a venv under /tmp).
        cmd += ["--ro-bind", "/sys", "/sys", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/dev/shm",
                "--tmpfs", "/tmp", "--dir", HOME]
        tools = _cuda_home(env) + _compiler_homes(env)
        for path in python_paths() + [p for p in ro_paths if os.path.exists(p)] + tools:
            cmd += ["--ro-bind", path, path]
        for path in _library_dirs(env):
            cmd += ["--ro-bind-try", path, path]
        for node in gpu_devices():
            cmd += ["--dev-bind", node, node]
        cmd += ["--bind", candidate, candidate, "--bind", cache, CACHE, "--chdir", candidate]
        caches = {"TRITON_CACHE_DIR": f"{CACHE}/triton", "TRITON_HOME": f"{CACHE}/triton-home",
                  "CUPY_CACHE_DIR": f"{CACHE}/cupy", "TORCH_EXTENSIONS_DIR": f"{CACHE}/torch-extensions",
                  "TORCHINDUCTOR_CACHE_DIR": "/tmp/inductor"}
        for name, value in (inner_env | caches).items():
            cmd += ["--setenv", name, value]
        return cmd + ["--"] + argv, {}


def _bin_dirs(path: str) -> list[str]:
    """PATH inside: the Python environment's bin folder, then the system's folders of the caller's PATH."""
    dirs = [os.path.join(sys.prefix, "bin")]
    for d in path.split(os.pathsep):
        if d and d not in dirs and any(_inside(d, s) for s in SYSTEM):
            dirs.append(d)
    return dirs + [d for d in ("/usr/local/bin", "/usr/bin", "/bin") if d not in dirs]


def _cuda_home(env: dict[str, str]) -> list[str]:
    """A CUDA toolkit outside /usr (CUDA_HOME or CUDA_PATH), for torch extension builds."""
    return [p for p in {env.get("CUDA_HOME"), env.get("CUDA_PATH")}
            if p and os.path.isdir(p) and not _under_system(os.path.abspath(p))]


def _compiler_homes(env: dict[str, str]) -> list[str]:
    """A C/C++ compiler outside /usr named by CC or CXX (Triton builds its launchers with CC): its installation, the
    folder above its bin/ (headers, libexec and libraries live beside it), else its own folder."""
    homes = set()
    for name in ("CC", "CXX"):
        path = env.get(name, "")
        if os.path.isabs(path) and os.path.exists(path):
            folder = os.path.dirname(os.path.realpath(path))
            home = os.path.dirname(folder) if os.path.basename(folder) == "bin" else folder
            if home != "/" and not _under_system(home):
                homes.add(home)
    return sorted(homes)


def _library_dirs(env: dict[str, str]) -> list[str]:
    return [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep)
            if p and os.path.isabs(p) and os.path.isdir(p) and not _under_system(p)]
