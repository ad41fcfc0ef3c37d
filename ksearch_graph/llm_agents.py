"""The LLM planner and coder: prompts from ``ksearch_graph/prompts/``, answers through ``llm.LLMClient``.

The planner returns edit scripts (structured output, validated with pydantic, repaired on error);
the coder returns source files extracted from fenced code blocks. Token usage of every call,
repairs included, comes back as ``Usage`` for the run's ledger.

When the model's context is known (``LLMSettings.context_tokens``), every prompt is fitted into it:
the long parts (spec, reference, code, logs, world-model view) are cut, largest first, until the
estimated prompt plus the answer's token limit fits. A small context (a small local model) also
selects compact prompts from the start: a shorter spec excerpt, world-model view and logs.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template
from typing import Callable

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage, SystemMessage
from pydantic import Field

from .agents import CodeAnswer, CodeRequest, Evidence, PlannerOutputError, Usage
from .config import SearchConfig
from .llm import (CodeExtractionError, LLMClient, LLMConfigError, LLMSettings, StructuredOutputError, TokenLedger,
                  extract_code, make_chat_model)
from .task import Task

from .world_model import MAX_INIT_NODES, EditScript, InsertOp, WorldModel, render

_SHORT_SPEC_CHARS = 1500  # later prompts repeat only the start of the spec; the first ones carry it all
_LOG_CHARS = 1500  # of a failure log in the planner's too-hard prompt

# Compact mode: below this context a model is small, and long prompts also cost it minutes on a CPU.
_COMPACT_BELOW_TOKENS = 16_000
_COMPACT_SPEC_CHARS = 3000
_COMPACT_SHORT_SPEC_CHARS = 600
_COMPACT_LOG_CHARS = 800
_COMPACT_RENDER_CHARS = 2500

_CHARS_PER_TOKEN = 3.5  # conservative for English and code with BPE tokenizers (measured ~3.8-4.2)
_CHAT_OVERHEAD_TOKENS = 64  # the chat template's role markers around the messages
_REPAIR_REQUEST_TOKENS = 300  # the errors and request of one repair round
_MIN_PIECE_CHARS = 200  # below this a cut piece is dropped rather than halved again


class InitScript(EditScript):
    """The initial edit script: 3-8 inserts and no reflection, stated in the schema itself.

    Servers that decode against the schema (llama.cpp) then enforce the rules; a small model left
    to the prompt alone often answers with no ops at all, which cannot initialise a world model.
    """

    reflection: None = None
    ops: list[InsertOp] = Field(min_length=3, max_length=MAX_INIT_NODES)


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text) / _CHARS_PER_TOKEN)


@dataclass(frozen=True)
class PromptBudget:
    """What a prompt may hold for one model: compact or not, and its token limit (None: no limit known)."""

    compact: bool
    prompt_tokens: int | None

    @classmethod
    def for_settings(cls, settings: LLMSettings, *, structured: bool) -> PromptBudget:
        context = settings.context_tokens
        if context is None:
            return cls(False, None)
        answer = settings.max_tokens or context // 4
        reserve = answer + _CHAT_OVERHEAD_TOKENS
        if structured and settings.max_repairs:
            # A repair round re-sends the prompt with the failed answer and the errors appended.
            reserve += answer + _REPAIR_REQUEST_TOKENS
        if context - reserve < 512:
            raise LLMConfigError(f"a context of {context} tokens leaves no room for a prompt next to "
                                 f"max_tokens={answer}; lower max_tokens or use a larger context")
        return cls(context < _COMPACT_BELOW_TOKENS, context - reserve)


def fit_prompt(build: Callable[[dict[str, int]], list[str]], pieces: dict[str, int], budget: PromptBudget) -> list[str]:
    """The messages ``build(limits)`` makes, with the pieces cut until they fit ``budget``.

    ``pieces`` maps each cuttable part of the prompt to its starting size in characters; ``build``
    must keep every piece within its limit. The largest piece is halved (then dropped) first, so
    short parts (the action, the errors) survive and a prompt that fits is left untouched.
    """
    limits = dict(pieces)
    messages = build(limits)
    if budget.prompt_tokens is None:
        return messages
    while sum(estimate_tokens(m) for m in messages) > budget.prompt_tokens:
        name = max(limits, key=limits.__getitem__, default=None)
        if name is None or limits[name] == 0:
            raise LLMConfigError(f"the prompt does not fit in {budget.prompt_tokens} tokens even with every "
                                 "long part removed; use a model with a larger context")
        limits[name] = limits[name] // 2 if limits[name] > 2 * _MIN_PIECE_CHARS else 0
        messages = build(limits)
    return messages


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    marker = "\n[... cut to fit the model's context]"
    return text[: max(0, limit - len(marker))] + marker if limit > len(marker) else ""


def prompt_template(name: str) -> str:
    """A prompt template: the package's own (shipped in the wheel), or from $KSEARCH_PROMPTS_DIR if set."""
    if folder := os.environ.get("KSEARCH_PROMPTS_DIR"):
        return (Path(folder) / f"{name}.md").read_text(encoding="utf-8")
    return resources.files("ksearch_graph").joinpath("prompts", f"{name}.md").read_text(encoding="utf-8")


def prompt(name: str, **values) -> str:
    text = prompt_template(name)
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


def _task_pieces(task: Task, budget: PromptBudget) -> dict[str, int]:
    spec = len(task.spec_text)
    return {"spec": min(spec, _COMPACT_SPEC_CHARS) if budget.compact else spec, "reference": len(task.reference_source)}


def _task_fields(task: Task, limits: dict[str, int], budget: PromptBudget) -> dict:
    spec = _clip(task.spec_text, limits["spec"])
    short = min(_COMPACT_SHORT_SPEC_CHARS if budget.compact else _SHORT_SPEC_CHARS, limits["spec"])
    return {
        "task_name": task.name,
        "language": task.spec.language,
        "task_spec": spec,
        "task_summary": spec if len(spec) <= short else spec[:short] + "\n[...]",
        "reference": _clip(task.reference_source, limits["reference"]),
    }


def _attempt_lines(attempts: list[dict]) -> str:
    return "\n".join(
        f"- {a['id']} ({a['prompt_kind']}): {a['status']}"
        + (f", score {a['score']:.4g}x, {a['latency_us']:.4g} us" if a["status"] == "passed" and a["latency_us"] else "")
        for a in attempts
    )


def _files_block(files: dict[str, str] | None, limit: int | None = None) -> str:
    if not files:
        return ""
    text = "\n".join(f"# file: {name}\n{text}" for name, text in files.items())
    return text if limit is None else _clip(text, limit)


class LLMPlanner:
    def __init__(self, settings: LLMSettings, chat_model: BaseChatModel | None = None, *, render_chars: int = 6000):
        self.settings = settings
        self.chat_model = chat_model or make_chat_model(settings)
        self.render_chars = render_chars

    @property
    def budget(self) -> PromptBudget:
        return PromptBudget.for_settings(self.settings, structured=True)

    def _ask(self, build: Callable[[dict[str, int]], str], pieces: dict[str, int],
             schema: type[EditScript] = EditScript) -> tuple[EditScript, Usage]:
        """Ask with the user prompt ``build(limits)``, its pieces cut to fit the context."""
        system = prompt("planner_system")
        _, user = fit_prompt(lambda limits: [system, build(limits)], pieces, self.budget)
        ledger = TokenLedger()
        client = LLMClient(self.settings, "planner", ledger, chat_model=self.chat_model)
        messages = [SystemMessage(content=system), HumanMessage(content=user)]
        try:
            script, _ = client.structured(messages, schema)
        except StructuredOutputError as e:
            raise PlannerOutputError(e.errors, _usage(ledger)) from None
        return script, _usage(ledger)

    def initial(self, task: Task, wm: WorldModel, *, errors: list[str]):
        root = wm.nodes["root"].attachment
        measured = f" (measured: score {root.score:.4g}x vs. the reference)" if root else ""
        budget = self.budget

        def build(limits):
            seed = ""
            if task.seed_source and limits["seed"]:
                seed = f"\n# Seed solution, attached to the root{measured}\n```python\n{_clip(task.seed_source, limits['seed'])}\n```\n"
            return prompt("init_world_model", **_task_fields(task, limits, budget), seed_section=seed,
                          errors_section=_errors_section(errors))

        return self._ask(build, {**_task_pieces(task, budget), "seed": len(task.seed_source or "")}, InitScript)

    def after_cycle(self, task: Task, wm: WorldModel, evidence: Evidence, *, errors: list[str]):
        b = evidence.best
        observed = f"{b['score'] / evidence.parent_score:.3g}x vs. the parent" if evidence.parent_score else \
            f"score {b['score']:.4g}x vs. the reference"
        code = _files_block(evidence.best_files)

        def outcome(limits):
            return f"\n# The cycle's best code ({b['id']}, now attached to {evidence.node_id})\n```\n{_clip(code, limits['outcome'])}\n```\n"

        instructions = (f"Node {evidence.node_id} is now closed. Insert 1-3 open actions under it (at least one: the "
                        "continuation of this success), re-score other open actions with what you learned "
                        "(update), prune ones that are now wrong or dominated.")
        return self._update(task, wm, evidence, observed, outcome, len(code), instructions, errors)

    def too_hard(self, task: Task, wm: WorldModel, evidence: Evidence, *, errors: list[str]):
        log = evidence.last_log[: _COMPACT_LOG_CHARS if self.budget.compact else _LOG_CHARS]

        def outcome(limits):
            return f"\n# No attempt passed. Last failure:\n```\n{_clip(log, limits['outcome'])}\n```\n"

        instructions = (f"The action on {evidence.node_id} was too hard as stated. Down-score it (update value / "
                        "difficulty), rewrite it into something implementable, split it into smaller steps, or "
                        "prune it if the idea itself is wrong.")
        return self._update(task, wm, evidence, "no passing attempt", outcome, len(log), instructions, errors)

    def _update(self, task, wm, evidence, observed, outcome, outcome_chars, instructions, errors):
        action = wm.nodes[evidence.node_id].action
        budget = self.budget
        render_chars = min(self.render_chars, _COMPACT_RENDER_CHARS) if budget.compact else self.render_chars

        def build(limits):
            # The world model is cut by re-rendering it with a smaller budget: whole nodes, never half a line.
            view = render(wm, budget_chars=limits["world_model"], focus=evidence.node_id) if limits["world_model"] else ""
            return prompt(
                "update_world_model", **_task_fields(task, limits, budget), world_model=view,
                node_id=evidence.node_id, action_title=action.title, action_description=action.description,
                predicted_gain=action.predicted_gain, observed=observed, attempts=_attempt_lines(evidence.attempts),
                outcome_section=outcome(limits), instructions=instructions, errors_section=_errors_section(errors),
            )

        return self._ask(build, {**_task_pieces(task, budget), "world_model": render_chars, "outcome": outcome_chars})


_FORMAT_RULES = {
    "triton": "one ```python block: a module defining `$entry(...)` that launches your Triton kernel(s).",
    "pytorch": "one ```python block: a module defining `$entry(...)`.",
    "cupy": "one ```python block: a module defining `$entry(...)` that compiles your CUDA C++ with cupy.RawModule "
            "(NVRTC) and launches it on torch's current stream (cupy.cuda.ExternalStream).",
    "cuda": "one fenced block per file, the file name in the fence header (```cpp kernel.h, ```cuda kernel.cu, "
            "```cpp main.cpp); main.cpp binds `$entry` with pybind11.",
}


class LLMCoder:
    def __init__(self, settings: LLMSettings, chat_model: BaseChatModel | None = None):
        self.settings = settings
        self.chat_model = chat_model or make_chat_model(settings)

    def write(self, request: CodeRequest) -> CodeAnswer:
        task = request.task
        budget = PromptBudget.for_settings(self.settings, structured=False)
        rules = Template(_FORMAT_RULES[task.spec.language]).substitute(entry=task.spec.entry_point)
        system = prompt("coder_system", format_rules=rules, atol=task.spec.tolerance.atol, rtol=task.spec.tolerance.rtol)
        feedback = request.feedback[: _COMPACT_LOG_CHARS if budget.compact else None]
        pieces = {**_task_pieces(task, budget), "base": len(_files_block(request.base_files) or task.seed_source or ""),
                  "last": len(_files_block(request.last_files)), "feedback": len(feedback)}
        _, user = fit_prompt(lambda limits: [system, self._user_prompt(request, limits, budget, feedback)], pieces, budget)
        ledger = TokenLedger()
        client = LLMClient(self.settings, "coder", ledger, chat_model=self.chat_model)
        text, _ = client.text([SystemMessage(content=system), HumanMessage(content=user)])
        try:
            files = extract_code(text, language=task.spec.language, default_file=task.spec.solution_file)
        except CodeExtractionError as e:
            return CodeAnswer(files={}, usage=_usage(ledger), error=f"no usable code in the answer: {e}")
        return CodeAnswer(files=files, usage=_usage(ledger))

    @staticmethod
    def _user_prompt(request: CodeRequest, limits: dict[str, int], budget: PromptBudget, feedback: str) -> str:
        task = request.task
        a = request.action
        fields = {**_task_fields(task, limits, budget), "action_title": a["title"], "action_description": a["description"],
                  "action_rationale": a.get("rationale", ""), "feedback": _clip(feedback, limits["feedback"])}
        if request.base_files:
            base = (f"# Start from this code (score {request.base_summary.get('score') or 0:.4g}x)\n```\n"
                    f"{_files_block(request.base_files, limits['base'])}\n```\n")
        elif task.seed_source:
            # Small models write no working kernel zero-shot, but adapt an example well: with no base
            # code (the seed failed or was not attached), the seed still shows the expected shape.
            base = (f"# An example solution of this task (the seed; follow its structure and API use)\n"
                    f"```python\n{_clip(task.seed_source, limits['base'])}\n```\n")
        else:
            base = "There is no code yet: write the kernel from the spec.\n"
        if request.kind == "first":
            return prompt("code_first", **fields, base_section=base)
        if request.kind == "debug":
            return prompt("code_debug", **fields, base_section=base, last_id=request.last_summary["id"],
                          last_code=_files_block(request.last_files, limits["last"]))
        last = ""
        if request.last_summary and request.last_summary["id"] != request.base_summary["id"]:
            last = (f"\nThe last attempt ({request.last_summary['id']}: {request.last_summary['status']}):\n```\n"
                    f"{_files_block(request.last_files, limits['last'])}\n```\n")
        return prompt("code_improve", **fields, best_id=request.base_summary["id"],
                      best_score=f"{request.base_summary['score']:.4g}",
                      best_code=_files_block(request.base_files, limits["base"]), last_section=last)


def make_llm_agents(config: SearchConfig) -> tuple[LLMPlanner, LLMCoder]:
    if config.planner_llm is None or config.coder_llm is None:
        raise ValueError("an LLM search needs planner_llm and coder_llm settings")
    return (LLMPlanner(config.planner_llm, render_chars=config.world_model_render_chars),
            LLMCoder(config.coder_llm))
