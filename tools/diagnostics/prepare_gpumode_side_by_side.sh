#!/usr/bin/env bash
# Lays out, in .gpumode/ at the repository root (ignored by git, never committed: GPU MODE's files may not be copied
# into this repository), what tools/diagnostics/gpumode_side_by_side.py needs for TriMul:
#   .gpumode/reference-kernels/problems/bioml/trimul/   upstream's problem: task.yml, reference.py, task.py,
#                                                       utils.py, eval.py, submission.py (its template)
#   .gpumode/submissions/*.py                           the public TriMul submissions of K-Search's results folder
#   .gpumode/SOURCES.txt                                the commits they came from
#   .gpumode/pylib/yaml/                                PyYAML's pure-Python package, from $PYTHON's, for a GPU host
#                                                       without it (PYTHONPATH=.gpumode/pylib; ksearch_graph.tasks.gpumode
#                                                       reads task.yml with it)
#
#   tools/diagnostics/prepare_gpumode_side_by_side.sh [REFERENCE_KERNELS_GIT] [KSEARCH_GIT]
#
# Each argument is a git directory (bare, or a checkout's .git, or a checkout); the default is the session's mirror.
# PYTHON (default: .venv/bin/python, else python3) is the interpreter whose PyYAML is copied.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
UPSTREAM="${1:-/work/.mirror/gpu-mode+reference-kernels/repo}"
KSEARCH="${2:-/work/.mirror/caoshiyi+K-Search/repo}"
PROBLEM="problems/bioml/trimul"
RESULTS="results/gpumode_trimul"
SUBMISSIONS=(ksearch_best TTT shiyegao zeyushen)
DEST="$ROOT/.gpumode"

gitdir() {  # a checkout's .git, or the directory itself
  if [ -d "$1/.git" ]; then echo "$1/.git"; else echo "$1"; fi
}

UP_GIT="$(gitdir "$UPSTREAM")"
KS_GIT="$(gitdir "$KSEARCH")"
for g in "$UP_GIT" "$KS_GIT"; do
  git --git-dir="$g" rev-parse --verify -q HEAD >/dev/null || { echo "error: $g is not a git directory" >&2; exit 2; }
done

rm -rf "$DEST"
mkdir -p "$DEST/reference-kernels" "$DEST/submissions"
git --git-dir="$UP_GIT" archive HEAD "$PROBLEM" | tar -x -C "$DEST/reference-kernels"
for name in "${SUBMISSIONS[@]}"; do
  git --git-dir="$KS_GIT" show "HEAD:$RESULTS/$name.py" > "$DEST/submissions/$name.py"
done
PYTHON="${PYTHON:-$([ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python3)}"
YAML_DIR="$("$PYTHON" -c 'import os, yaml; print(os.path.dirname(yaml.__file__))')"
mkdir -p "$DEST/pylib/yaml"
cp "$YAML_DIR"/*.py "$DEST/pylib/yaml/"  # the pure-Python parser only: the C extension is left out
{
  echo "gpu-mode/reference-kernels $(git --git-dir="$UP_GIT" rev-parse HEAD) $PROBLEM"
  echo "caoshiyi/K-Search $(git --git-dir="$KS_GIT" rev-parse HEAD) $RESULTS/{$(IFS=,; echo "${SUBMISSIONS[*]}")}.py"
  echo "pyyaml $("$PYTHON" -c 'import yaml; print(yaml.__version__)') (pure Python) from $YAML_DIR"
} > "$DEST/SOURCES.txt"

if git -C "$ROOT" check-ignore -q "$DEST"; then
  echo "ready: $DEST (ignored by git)"
else
  echo "warning: $DEST is not ignored by git here; add /.gpumode/ to .gitignore before committing" >&2
fi
find "$DEST" -type f -not -path "*/pylib/*" | sed "s|$ROOT/||" | sort
