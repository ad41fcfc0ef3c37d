#!/usr/bin/env bash
# Lays out, in .public/ at the repository root (ignored by git, never committed: the sources' files may not be copied
# into this repository), the three public problem sources for tools/task_coverage.py on a GPU host:
#   .public/reference-kernels/problems/   GPU MODE's problems (all of them, with their shared files)
#   .public/KernelBench/KernelBench/      KernelBench's levels 1-4
#   .public/flashinfer-trace/             the FlashInfer-Trace dataset's definitions and workloads (no blob files)
#   .public/pylib/yaml/                   PyYAML's pure-Python package, for a GPU host without it (PYTHONPATH)
#   .public/SOURCES.txt                   the commits they came from
#
#   tools/diagnostics/prepare_public_sources.sh [REFERENCE_KERNELS_GIT] [KERNELBENCH_GIT] [FLASHINFER_BENCH_GIT [COMMIT]]
#
# Each argument is a git directory (bare, or a checkout's .git, or a checkout); the defaults are the session's mirrors.
# The FlashInfer-Trace dataset is taken from flashinfer-bench's flashinfer_trace/ folder at COMMIT (default: the last
# commit that held it, before it moved to the Hugging Face Hub).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
UPSTREAM="${1:-/work/.mirror/gpu-mode+reference-kernels/repo}"
KERNELBENCH="${2:-/work/.mirror/ScalingIntelligence+KernelBench/repo}"
FIB="${3:-/work/.mirror/flashinfer-ai+flashinfer-bench/repo}"
FIB_COMMIT="${4:-ecafa9c2c62007667838226068b21ca9ff1c9183}"
DEST="$ROOT/.public"

gitdir() {  # a checkout's .git, or the directory itself
  if [ -d "$1/.git" ]; then echo "$1/.git"; else echo "$1"; fi
}

rm -rf "$DEST"
mkdir -p "$DEST/reference-kernels" "$DEST/KernelBench" "$DEST/flashinfer-trace"
git --git-dir="$(gitdir "$UPSTREAM")" archive HEAD problems | tar -x -C "$DEST/reference-kernels"
git --git-dir="$(gitdir "$KERNELBENCH")" archive HEAD KernelBench | tar -x -C "$DEST/KernelBench"
git --git-dir="$(gitdir "$FIB")" archive "$FIB_COMMIT" flashinfer_trace | tar -x -C "$DEST/flashinfer-trace" \
  --strip-components=1
PYTHON="${PYTHON:-$([ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python3)}"
YAML_DIR="$("$PYTHON" -c 'import os, yaml; print(os.path.dirname(yaml.__file__))')"
mkdir -p "$DEST/pylib/yaml"
cp "$YAML_DIR"/*.py "$DEST/pylib/yaml/"  # the pure-Python parser only: the C extension is left out
{
  echo "gpu-mode/reference-kernels $(git --git-dir="$(gitdir "$UPSTREAM")" rev-parse HEAD) problems/"
  echo "ScalingIntelligence/KernelBench $(git --git-dir="$(gitdir "$KERNELBENCH")" rev-parse HEAD) KernelBench/"
  echo "flashinfer-ai/flashinfer-bench $FIB_COMMIT flashinfer_trace/"
} > "$DEST/SOURCES.txt"
if git -C "$ROOT" check-ignore -q "$DEST"; then
  echo "ready: $DEST (ignored by git; $(du -sh "$DEST" | cut -f1))"
else
  echo "warning: $DEST is not ignored by git here; add /.public/ to .gitignore before committing" >&2
fi
cat "$DEST/SOURCES.txt"
