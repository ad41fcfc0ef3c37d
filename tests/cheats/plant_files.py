"""Cheat class: persistent compromise. A candidate plants code where later evaluations (and the user's own Python)
would run it: a .pth file, a module and a sitecustomize.py in every folder of its import path (site-packages among
them), a redefinition appended to the harness's own comparison (harness/judge/compare.py), files in the compile caches of
other sources (beside its own cache folder), in HOME and in /tmp. Then it computes relu(x @ w) honestly.
Expected: passed, and none of its files anywhere outside its own evaluation (tests/test_sandbox.py looks); a later
evaluation judges as before.
"""

import glob
import os
import site
import sys
import sysconfig

import torch

MARK = "ksearch-planted-MARKER"
planted = []


def plant(path: str, text: str, mode: str = "w") -> None:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, mode) as f:
            f.write(text)
        planted.append(path)
    except OSError:
        pass


folders = {p for p in sys.path if p and os.path.isdir(p)}
folders |= set(site.getsitepackages()) | {site.getusersitepackages(), sysconfig.get_paths()["purelib"]}
for folder in folders:
    plant(os.path.join(folder, "zz_ksearch_planted.pth"), f"import ksearch_planted  # {MARK}\n")
    plant(os.path.join(folder, "ksearch_planted.py"), f"# {MARK}\nimport builtins\nbuiltins.PLANTED = True\n")
    plant(os.path.join(folder, "sitecustomize.py"), f"# {MARK}\n", "a")
for compare in [c for p in sys.path if p for c in glob.glob(os.path.join(p, "ksearch_graph/harness/judge/compare.py"))]:
    plant(compare, f"\n# {MARK}\ndef compare(*a, **k):\n    return None, '', 0.0, 0.0\n", "a")
cache = os.environ.get("TRITON_CACHE_DIR", "/ksearch-cache/triton")
for sibling in (os.path.dirname(os.path.dirname(cache)), os.path.dirname(cache)):
    plant(os.path.join(sibling, "by-source", "0" * 32, "triton", "planted.json"), MARK)
    plant(os.path.join(sibling, "harness", "triton", "planted.json"), MARK)
plant(os.path.expanduser("~/.bashrc"), f"echo {MARK}\n", "a")
plant("/tmp/ksearch-planted.txt", MARK)
print(f"planted {len(planted)} files", file=sys.stderr)


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ w)
