"""Compile caches restored into an evaluation whose candidate's process is already running (harness/compile_cache.py).

The candidate's process is started ahead and maps the launch cover's compiled modules from its cache before the
judge restores what earlier evaluations of the same source kept. The restore adds what is missing and leaves every
file the process may have mapped as it is: a plain copy rewrote them in place, and on the GPU the process died by
SIGSEGV inside them.
"""

from __future__ import annotations

import mmap
import os

from ksearch_graph.harness import compile_cache


def _write(path, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def test_restore_adds_what_is_missing_and_never_rewrites_a_mapped_file(tmp_path):
    store, cache = tmp_path / "store", tmp_path / "cache"
    kept = store / compile_cache.BY_SOURCE / "k1"
    _write(kept / "triton" / "AB12" / "cuda_utils.so", b"kept copy, longer than the one mapped" * 100)
    _write(kept / "triton" / "CD34" / "__triton_launcher.so", b"launcher" * 50)
    os.symlink("AB12", kept / "triton" / "latest")
    mapped = cache / "triton" / "AB12" / "cuda_utils.so"
    _write(mapped, b"the running process's own module" + b"\0" * 4064)
    inode = os.stat(mapped).st_ino
    with open(mapped, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
        assert compile_cache.restore(str(store), "k1", str(cache))
        # The mapped file is untouched: same inode, same bytes, as the process sees it.
        assert view[:32] == b"the running process's own module" and os.stat(mapped).st_ino == inode
        assert os.path.getsize(mapped) == 4096
    added = cache / "triton" / "CD34" / "__triton_launcher.so"
    assert added.read_bytes() == b"launcher" * 50
    assert os.readlink(cache / "triton" / "latest") == "AB12"
    assert not [p for p in cache.rglob("*.restoring")]  # no copy left aside
    assert not compile_cache.restore(str(store), "unknown", str(cache))


def test_the_harness_seed_fills_a_new_cache(tmp_path):
    store, cache = tmp_path / "store", tmp_path / "cache"
    _write(store / compile_cache.HARNESS / "triton" / "EF56" / "cover.cubin", b"cubin")
    compile_cache.seed_harness(str(store), str(cache))
    assert (cache / "triton" / "EF56" / "cover.cubin").read_bytes() == b"cubin"
