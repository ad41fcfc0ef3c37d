"""Shared test fixtures: the example task, a scripted chat model, the fake OpenAI server, CLI helpers."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult

sys.path.insert(0, str(Path(__file__).parent))
from fake_openai_server import FakeOpenAIServer, Reply, fake_openai  # noqa: E402,F401

from ksearch_graph.harness.modules import load_module as _load_module  # noqa: E402  (stdlib only: no Triton)

# Without CUDA, Triton runs in its interpreter. Triton reads TRITON_INTERPRET when a @triton.jit function is defined,
# its own library's included, and torch imports Triton in-process (torch.utils.flop_counter: the speed-of-light
# code): set it before any test can import Triton, or a kernel run later calls compiled helpers and fails.
if not importlib.util.find_spec("torch") or not __import__("torch").cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

REPO = Path(__file__).resolve().parent.parent
SOFTMAX = REPO / "examples" / "softmax"


def load_module(name: str, path: Path):
    """Import a file as module ``name``, as the harness does (harness/modules.py)."""
    return _load_module(name, str(path))


def task_modules(root: Path, prefix: str, template_configs: dict[str, dict], tmp_root: Path) -> dict:
    """A task's reference, baseline and seed, and its template rendered with each of ``template_configs``."""
    from ksearch_graph.search.roles.template import render_template
    from ksearch_graph.tasks.task import load_task

    task = load_task(root)
    mods = {name: load_module(f"{prefix}_{name}", root / f"{name}.py") for name in ("reference", "baseline", "seed")}
    for label, params in template_configs.items():
        path = tmp_root / f"{prefix}_template_{label}.py"
        path.write_text(render_template(task, params)[task.spec.solution_file])
        mods[f"template_{label}"] = load_module(path.stem, path)
    return mods


@pytest.fixture(scope="session")
def softmax_task():
    from ksearch_graph.tasks.task import load_task

    return load_task(SOFTMAX)


Answer = str | Exception | Callable[[list[BaseMessage]], str]


class ScriptedChatModel(BaseChatModel):
    """Stands in for the LLM's judgement only: answers from two queues, one per role.

    A prompt whose system message is the planner's takes the next planner answer, any other the next
    coder answer. An answer may be a string, an exception to raise (API errors), or a function of the
    messages. Every prompt is recorded per role. Usage is reported like a real endpoint's.
    """

    planner: list[Any] = []
    coder: list[Any] = []
    seen: dict[str, list[list[BaseMessage]]] = {}

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools, **kwargs):
        return self  # the script already says which tool to call

    def _role(self, messages: list[BaseMessage]) -> str:
        return "planner" if "planner of K-Search" in str(messages[0].content) else "coder"

    def _generate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        role = self._role(messages)
        self.seen.setdefault(role, []).append(messages)
        queue = getattr(self, role)
        if not queue:
            raise AssertionError(f"the script has no {role} answer left")
        answer = queue.pop(0)
        if isinstance(answer, Exception):
            raise answer
        if callable(answer):
            answer = answer(messages)
        if isinstance(answer, AIMessage):  # e.g. a tool call, for agents
            return ChatResult(generations=[ChatGeneration(message=answer)])
        text = answer
        tokens = sum(len(str(m.content)) for m in messages) // 4
        message = AIMessage(content=text, usage_metadata={"input_tokens": tokens, "output_tokens": len(text) // 4,
                                                          "total_tokens": tokens + len(text) // 4})
        return ChatResult(generations=[ChatGeneration(message=message)])


@pytest.fixture
def scripted():
    return ScriptedChatModel(planner=[], coder=[], seen={})


def action(title: str, value: float = 0.6, difficulty: int = 2, **params) -> dict:
    return {"title": title, "description": f"Do {title}.", "difficulty": difficulty, "value": value,
            "predicted_gain": 1.2, "rationale": "test", "params": params}


def reflection() -> dict:
    return {"current": "c", "follow_through": "yes", "update_belief": "u", "perf_gap": "p"}


def script(ops: list[dict], *, reflect: bool = True, analysis: str = "") -> str:
    return json.dumps({"analysis": analysis, "reflection": reflection() if reflect else None, "ops": ops})


def insert(parent: str, title: str, value: float = 0.6, **kw) -> dict:
    return {"op": "insert", "parent": parent, "action": action(title, value, **kw)}


def kernel_answer(task, **params) -> str:
    """A coder answer holding a template instance (real Triton code from the example task)."""
    from ksearch_graph.search.roles.template import render_template

    source = render_template(task, params)[task.spec.solution_file]
    return f"Here is the kernel.\n```python\n{source}\n```\n"


def run_cli(*args: str, timeout: float = 600, env: dict | None = None, check: bool = False) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env.pop("OPENAI_API_KEY", None) if env is None or "OPENAI_API_KEY" not in env else None
    proc = subprocess.run([sys.executable, "-m", "ksearch_graph.cli.main", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env=full_env)
    if check and proc.returncode != 0:
        raise AssertionError(f"ksearch {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def show_json(run_dir) -> dict:
    """``ksearch show DIR --json``, parsed."""
    return json.loads(run_cli("show", str(run_dir), "--json", check=True).stdout)



def attempt_rows(run_dir, *columns: str) -> list[tuple]:
    """The run's attempts besides the seed, in iteration order, as tuples of ``columns`` (read from store.sqlite)."""
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(Path(run_dir) / "store.sqlite")) as db:
        return db.execute(f"select {', '.join(columns)} from attempts where prompt_kind != 'seed' "
                          "order by iteration").fetchall()
