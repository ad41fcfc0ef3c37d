"""Compile caches (Triton, CuPy, torch extensions) that survive between evaluations without letting one candidate
poison another's.

The candidate's process writes only this evaluation's cache folder. The judge fills it, before the candidate is
imported, with what earlier evaluations of exactly the same source files left (``restore``), and keeps what it holds
afterwards under that source's key (``keep``). An entry is only ever read by evaluations of the source that wrote
it, so a planted entry harms nobody but its author. The harness's own kernel (the launch cover) comes from the
judge's cache (``seed_harness``), which no candidate writes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil

BY_SOURCE = "by-source"
HARNESS = "harness"  # the judge's own Triton cache (its TRITON_CACHE_DIR), never written by a candidate


def source_key(folder: str) -> str:
    """A hash of every file of the candidate (relative names and contents)."""
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            digest.update(os.path.relpath(path, folder).encode() + b"\0")
            with open(path, "rb") as f:
                digest.update(f.read() + b"\0")
    return digest.hexdigest()[:32]


def restore(store: str, key: str, cache: str) -> bool:
    """Add what evaluations of the source ``key`` kept to this evaluation's ``cache``; True if any was kept."""
    kept = os.path.join(store, BY_SOURCE, key)
    if not os.path.isdir(kept):
        return False
    add_missing(kept, cache)
    return True


def add_missing(source: str, cache: str) -> None:
    """Copy into ``cache`` the files of ``source`` it lacks, each whole or not at all, and never over a file it has.

    The candidate's process is already running when the judge restores (it was started ahead and has loaded the
    launch cover's compiled modules from ``cache``): rewriting a shared library it has mapped, as a plain copy
    does, changes its code under it (it died by SIGSEGV in Triton's launcher and C utilities on the GPU). An
    entry's path is a hash of its content, so a file already there is the same one."""
    for root, dirs, files in os.walk(source):
        target_dir = os.path.join(cache, os.path.relpath(root, source))
        os.makedirs(target_dir, exist_ok=True)
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            src, dst = os.path.join(root, name), os.path.join(target_dir, name)
            if os.path.lexists(dst):
                continue
            if os.path.islink(src):
                with contextlib.suppress(FileExistsError):
                    os.symlink(os.readlink(src), dst)
                continue
            aside = f"{dst}.{os.getpid()}.restoring"
            try:
                shutil.copy2(src, aside)
                os.link(aside, dst)  # appears whole; fails, leaving the other, if a file of that name came meanwhile
            except FileExistsError:
                pass
            except OSError:  # a filesystem without hard links: a rename, which could only replace a racing copy
                if not os.path.lexists(dst):
                    os.replace(aside, dst)
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(aside)


def keep(store: str, key: str, cache: str) -> None:
    """Keep this evaluation's cache under ``key`` when none is kept yet (a copy made aside, then renamed in)."""
    target = os.path.join(store, BY_SOURCE, key)
    if os.path.exists(target) or not os.path.isdir(cache) or not any(os.scandir(cache)):
        return
    aside = f"{target}.{os.getpid()}.tmp"
    try:
        shutil.copytree(cache, aside, symlinks=True)
        os.rename(aside, target)
    except OSError:  # another evaluation of the same source was quicker, or the disk is full: nothing kept
        shutil.rmtree(aside, ignore_errors=True)


def seed_harness(store: str, cache: str) -> None:
    """The judge's compiled harness kernels into a new evaluation's cache, so its candidate's process does not build
    them again."""
    harness = os.path.join(store, HARNESS, "triton")
    if os.path.isdir(harness):
        with contextlib.suppress(OSError):
            add_missing(harness, os.path.join(cache, "triton"))
