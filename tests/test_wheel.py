"""A wheel built from the repository, installed without -e, runs an LLM-path search.

The wheel is built from the package's own files (pyproject.toml, README.md, ksearch_graph/) and installed into a
fresh virtual environment; its dependencies (langgraph, torch, ...) come from the running environment's
site-packages, appended to the new environment's path after its own, so the ksearch_graph that runs is the
wheel's. The search runs from an empty working directory against the local stand-in OpenAI server.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from conftest import REPO, SOFTMAX, insert, kernel_answer, script
from fake_openai_server import FakeOpenAIServer, Reply

PACKAGE = REPO / "ksearch_graph"


def _build_wheel(tmp_path: Path) -> Path:
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(PACKAGE, source / "ksearch_graph", ignore=shutil.ignore_patterns("__pycache__"))
    # No build isolation: the build uses this environment's setuptools and needs no network.
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "dist"), "-q"], check=True, capture_output=True, text=True)
    [wheel] = (tmp_path / "dist").glob("ksearch_graph-*.whl")
    return wheel


def _fresh_venv(path: Path, wheel: Path) -> Path:
    venv.EnvBuilder(with_pip=True).create(path)
    python = path / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)],
                   check=True, capture_output=True, text=True)
    [own] = [Path(p) for p in json.loads(subprocess.check_output(
        [str(python), "-c", "import json, site; print(json.dumps(site.getsitepackages()))"]))]
    # A plain path line in a .pth file is appended to sys.path; the .pth files inside it are not run, so an
    # editable install of ksearch_graph there stays inactive.
    (own / "dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return python


@pytest.mark.slow
def test_installed_wheel_runs_an_llm_search_with_its_prompts(tmp_path, softmax_task):
    wheel = _build_wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    subpackages = {p.parent.relative_to(REPO).as_posix() for p in PACKAGE.rglob("__init__.py")}
    assert {f"{d}/__init__.py" for d in subpackages} <= names  # every subpackage ships
    prompts = sorted(p.name for p in (PACKAGE / "search" / "roles" / "prompts").glob("*.md"))
    assert prompts and {f"ksearch_graph/search/roles/prompts/{p}" for p in prompts} <= names

    python = _fresh_venv(tmp_path / "venv", wheel)
    work = tmp_path / "cwd"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KSEARCH_PROMPTS_DIR", "OPENAI_API_KEY")}
    where = subprocess.check_output([str(python), "-c", "import ksearch_graph; print(ksearch_graph.__file__)"],
                                    cwd=work, env=env, text=True).strip()
    assert Path(where).is_relative_to(tmp_path / "venv")

    init = json.loads(script([insert("root", f"idea {i}", value=0.9 - 0.1 * i) for i in range(3)], reflect=False))
    replies = [Reply.json(init), Reply.content(kernel_answer(softmax_task, VARIANT="online", BLOCK_N=256)),
               Reply.json(json.loads(script([insert("n1", "continue")])))]
    with FakeOpenAIServer(replies) as server:
        proc = subprocess.run([str(python.parent / "ksearch"), "run", str(SOFTMAX), "--run-dir", str(work / "run"),
                               "--iterations", "1", "--model", "fake-model", "--base-url", server.base_url],
                              cwd=work, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert server.remaining == 0
    installed = Path(where).parent / "search" / "roles" / "prompts"
    system = server.requests[0]["messages"][0]["content"]
    assert system.startswith((installed / "planner_system.md").read_text().splitlines()[0])
    assert "[  1/1] c1.1    first   passed" in proc.stdout, proc.stdout + proc.stderr
