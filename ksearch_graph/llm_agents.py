"""The LLM planner and coder: prompts from ``prompts/``, answers through ``llm.LLMClient``.

The planner returns edit scripts (structured output, validated with pydantic, repaired on error);
the coder returns source files extracted from fenced code blocks. Token usage of every call,
repairs included, comes back as ``Usage`` for the run's ledger.
"""

from __future__ import annotations

import os
from pathlib import Path
from string import Template

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage, SystemMessage

from .agents import CodeAnswer, CodeRequest, Evidence, PlannerOutputError, Usage
from .config import SearchConfig
from .llm import CodeExtractionError, LLMClient, LLMSettings, StructuredOutputError, TokenLedger, extract_code, make_chat_model
from .task import Task
from .world_model import EditScript, WorldModel, render

PROMPTS_DIR = Path(os.environ.get("KSEARCH_PROMPTS_DIR", Path(__file__).resolve().parent.parent / "prompts"))
_SHORT_SPEC_CHARS = 1500  # later prompts repeat only the start of the spec; the first ones carry it all


def prompt(name: str, **values) -> str:
    text = (PROMPTS_DIR / f"{name}.md").read_text()
    return Template(text).substitute({k: "" if v is None else str(v) for k, v in values.items()})


def _usage(ledger: TokenLedger) -> Usage:
    t = ledger.totals()
    return Usage(prompt_tokens=int(t["prompt_tokens"]), completion_tokens=int(t["completion_tokens"]),
                 cost_usd=float(t["cost_usd"]))


def _errors_section(errors: list[str]) -> str:
    if not errors:
        return ""
    lines = "\n".join(f"- {e}" for e in errors)
    return f"\nYour previous edit script was REJECTED, nothing of it was applied. Fix these problems:\n{lines}\n"


def _task_fields(task: Task) -> dict:
    spec = task.spec_text
    return {
        "task_name": task.name,
        "language": task.spec.language,
        "task_spec": spec,
        "task_summary": spec if len(spec) <= _SHORT_SPEC_CHARS else spec[:_SHORT_SPEC_CHARS] + "\n[...]",
        "reference": task.reference_source,
    }


def _attempt_lines(attempts: list[dict]) -> str:
    return "\n".join(
        f"- {a['id']} ({a['prompt_kind']}): {a['status']}"
        + (f", score {a['score']:.4g}x, {a['latency_us']:.4g} us" if a["status"] == "passed" and a["latency_us"] else "")
        for a in attempts
    )


def _files_block(files: dict[str, str] | None) -> str:
    if not files:
        return ""
    return "\n".join(f"# file: {name}\n{text}" for name, text in files.items())


class LLMPlanner:
    def __init__(self, settings: LLMSettings, chat_model: BaseChatModel | None = None, *, render_chars: int = 6000):
        self.settings = settings
        self.chat_model = chat_model or make_chat_model(settings)
        self.render_chars = render_chars

    def _ask(self, user: str) -> tuple[EditScript, Usage]:
        ledger = TokenLedger()
        client = LLMClient(self.settings, "planner", ledger, chat_model=self.chat_model)
        messages = [SystemMessage(content=prompt("planner_system")), HumanMessage(content=user)]
        try:
            script, _ = client.structured(messages, EditScript)
        except StructuredOutputError as e:
            raise PlannerOutputError(e.errors, _usage(ledger)) from None
        return script, _usage(ledger)

    def initial(self, task: Task, wm: WorldModel, *, errors: list[str]):
        seed = ""
        if task.seed_source:
            root = wm.nodes["root"].attachment
            measured = f" (measured: score {root.score:.4g}x vs. the reference)" if root else ""
            seed = f"\n# Seed solution, attached to the root{measured}\n```python\n{task.seed_source}\n```\n"
        return self._ask(prompt("init_world_model", **_task_fields(task), seed_section=seed,
                                errors_section=_errors_section(errors)))

    def after_cycle(self, task: Task, wm: WorldModel, evidence: Evidence, *, errors: list[str]):
        b = evidence.best
        observed = f"{b['score'] / evidence.parent_score:.3g}x vs. the parent" if evidence.parent_score else \
            f"score {b['score']:.4g}x vs. the reference"
        outcome = f"\n# The cycle's best code ({b['id']}, now attached to {evidence.node_id})\n```\n{_files_block(evidence.best_files)}\n```\n"
        instructions = (f"Node {evidence.node_id} is now closed. Insert 1-3 open actions under it (at least one: the "
                        "continuation of this success), re-score other open actions with what you learned "
                        "(update), prune ones that are now wrong or dominated.")
        return self._ask(self._update_prompt(task, wm, evidence, observed, outcome, instructions, errors))

    def too_hard(self, task: Task, wm: WorldModel, evidence: Evidence, *, errors: list[str]):
        outcome = f"\n# No attempt passed. Last failure:\n```\n{evidence.last_log[:1500]}\n```\n"
        instructions = (f"The action on {evidence.node_id} was too hard as stated. Down-score it (update value / "
                        "difficulty), rewrite it into something implementable, split it into smaller steps, or "
                        "prune it if the idea itself is wrong.")
        return self._ask(self._update_prompt(task, wm, evidence, "no passing attempt", outcome, instructions, errors))

    def _update_prompt(self, task, wm, evidence, observed, outcome, instructions, errors) -> str:
        action = wm.nodes[evidence.node_id].action
        return prompt(
            "update_world_model", **_task_fields(task),
            world_model=render(wm, budget_chars=self.render_chars, focus=evidence.node_id),
            node_id=evidence.node_id, action_title=action.title, action_description=action.description,
            predicted_gain=action.predicted_gain, observed=observed, attempts=_attempt_lines(evidence.attempts),
            outcome_section=outcome, instructions=instructions, errors_section=_errors_section(errors),
        )


_FORMAT_RULES = {
    "triton": "one ```python block: a module defining `$entry(...)` that launches your Triton kernel(s).",
    "pytorch": "one ```python block: a module defining `$entry(...)`.",
    "cuda": "one fenced block per file, the file name in the fence header (```cpp kernel.h, ```cuda kernel.cu, "
            "```cpp main.cpp); main.cpp binds `$entry` with pybind11.",
}


class LLMCoder:
    def __init__(self, settings: LLMSettings, chat_model: BaseChatModel | None = None):
        self.settings = settings
        self.chat_model = chat_model or make_chat_model(settings)

    def write(self, request: CodeRequest) -> CodeAnswer:
        task = request.task
        a = request.action
        fields = {**_task_fields(task), "action_title": a["title"], "action_description": a["description"],
                  "action_rationale": a.get("rationale", ""), "feedback": request.feedback}
        base = ""
        if request.base_files:
            base = f"# Start from this code (score {request.base_summary.get('score') or 0:.4g}x)\n```\n{_files_block(request.base_files)}\n```\n"
        elif task.seed_source is None:
            base = "There is no code yet: write the kernel from the spec.\n"
        if request.kind == "first":
            user = prompt("code_first", **fields, base_section=base)
        elif request.kind == "debug":
            user = prompt("code_debug", **fields, base_section=base, last_id=request.last_summary["id"],
                          last_code=_files_block(request.last_files))
        else:
            last = ""
            if request.last_summary and request.last_summary["id"] != request.base_summary["id"]:
                last = f"\nThe last attempt ({request.last_summary['id']}: {request.last_summary['status']}):\n```\n{_files_block(request.last_files)}\n```\n"
            user = prompt("code_improve", **fields, best_id=request.base_summary["id"],
                          best_score=f"{request.base_summary['score']:.4g}", best_code=_files_block(request.base_files),
                          last_section=last)
        rules = Template(_FORMAT_RULES[task.spec.language]).substitute(entry=task.spec.entry_point)
        system = prompt("coder_system", format_rules=rules, atol=task.spec.tolerance.atol, rtol=task.spec.tolerance.rtol)
        ledger = TokenLedger()
        client = LLMClient(self.settings, "coder", ledger, chat_model=self.chat_model)
        text, _ = client.text([SystemMessage(content=system), HumanMessage(content=user)])
        try:
            files = extract_code(text, language=task.spec.language, default_file=task.spec.solution_file)
        except CodeExtractionError as e:
            return CodeAnswer(files={}, usage=_usage(ledger), error=f"no usable code in the answer: {e}")
        return CodeAnswer(files=files, usage=_usage(ledger))


def make_llm_agents(config: SearchConfig) -> tuple[LLMPlanner, LLMCoder]:
    if config.planner_llm is None or config.coder_llm is None:
        raise ValueError("an LLM search needs planner_llm and coder_llm settings")
    return (LLMPlanner(config.planner_llm, render_chars=config.world_model_render_chars),
            LLMCoder(config.coder_llm))
