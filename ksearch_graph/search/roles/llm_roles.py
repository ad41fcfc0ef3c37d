"""The LLM planner and coder: prompts from ``ksearch_graph/search/roles/prompts/``, answers through ``llm.LLMClient``.

The planner returns edit scripts (structured output, validated with pydantic, repaired on error);
the coder returns source files extracted from fenced code blocks. Token usage of every call,
repairs included, comes back as ``Usage`` for the run's ledger.

Every prompt starts with the run's task block (prompt_parts.task_block: spec, reference, GPU and floors, the
planner's analysis), the same text in every call of a role, and puts what changes after it, so providers' prompt
caches can reuse the block (docs/llm.md). Each call's requests and raw answers come back in ``Usage.transcript``.

When the model's context is known (``LLMSettings.context_tokens``), every prompt is fitted into it:
the long parts (spec, reference, code, logs, world-model view) are cut, largest first, until the
estimated prompt plus the answer's token limit fits. A small context (a small local model) also
selects compact prompts from the start: a spec cut to a form that keeps every section, a shorter
world-model view and logs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage, SystemMessage
from pydantic import Field

from ksearch_graph.config import SearchConfig
from ksearch_graph.llm.answers import CodeExtractionError, extract_code
from ksearch_graph.llm.client import (
    LLMClient,
    LLMConfigError,
    LLMSettings,
    StructuredOutputError,
    TokenLedger,
    make_chat_model,
)
from ksearch_graph.search.policy import WEAK_VALUE, weak_frontier
from ksearch_graph.search.roles.prompt_parts import (
    compact_spec,
    headline,
    history_section,
    performance_table,
    task_block,
)
from ksearch_graph.search.roles.protocol import CodeAnswer, CodeRequest, Evidence, PlannerOutputError, Usage
from ksearch_graph.search.world_model import MAX_INIT_NODES, WorldModel, render
from ksearch_graph.search.world_model_edits import EditScript, InsertOp
from ksearch_graph.tasks.evaluation import EvalResult
from ksearch_graph.tasks.speed_of_light import SpeedOfLight
from ksearch_graph.tasks.task import Task

_LOG_CHARS = 3000  # of a failure log in the planner's too-hard prompt

# Compact mode: below this context a model is small, and long prompts also cost it minutes on a CPU. Its spec is
# cut to a form that keeps every section (prompt_parts.compact_spec), the same in every prompt of the run.
_COMPACT_BELOW_TOKENS = 16_000
_COMPACT_SPEC_CHARS = 3000
_COMPACT_LOG_CHARS = 800
_COMPACT_RENDER_CHARS = 2500
_COMPACT_ANALYSIS_CHARS = 800
_HISTORY_CHARS = 6000  # of the coder's history of the cycle's earlier attempts

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
    """A prompt template: from $KSEARCH_PROMPTS_DIR where it is set and holds one of that name (a folder may hold only
    the prompts it changes), else the package's own (shipped in the wheel)."""
    if (folder := os.environ.get("KSEARCH_PROMPTS_DIR")) and (Path(folder) / f"{name}.md").is_file():
        return (Path(folder) / f"{name}.md").read_text(encoding="utf-8")
    return resources.files("ksearch_graph.search.roles").joinpath("prompts", f"{name}.md").read_text(encoding="utf-8")


def prompt(name: str, **values) -> str:
    text = prompt_template(name)
    return Template(text).substitute({k: "" if v is None else str(v) for k, v in values.items()})


def _usage(ledger: TokenLedger, client: LLMClient) -> Usage:
    t = ledger.totals()
    return Usage(prompt_tokens=int(t["prompt_tokens"]), completion_tokens=int(t["completion_tokens"]),
                 cost_usd=float(t["cost_usd"]), cached_prompt_tokens=int(t["cached_prompt_tokens"]),
                 transcript=list(getattr(client, "transcript", [])))


def _errors_section(errors: list[str]) -> str:
    if not errors:
        return ""
    lines = "\n".join(f"- {e}" for e in errors)
    return f"\nYour previous edit script was REJECTED, nothing of it was applied. Fix these problems:\n{lines}\n"


def _task_pieces(task: Task, budget: PromptBudget, analysis: str = "") -> dict[str, int]:
    spec = len(task.spec_text)
    return {"spec": min(spec, _COMPACT_SPEC_CHARS) if budget.compact else spec, "reference": len(task.reference_source),
            "analysis": min(len(analysis), _COMPACT_ANALYSIS_CHARS) if budget.compact else len(analysis)}


def _task_fields(task: Task, limits: dict[str, int], sol: SpeedOfLight | None, analysis: str = "",
                 seed: str = "") -> dict:
    """The prompt's stable head (prompt_parts.task_block), and the old templates' fields for custom prompt folders."""
    spec = compact_spec(task.spec_text, limits["spec"])
    reference = _clip(task.reference_source, limits["reference"])
    block = task_block(task, spec=spec, reference=reference, sol=sol, seed=seed,
                       analysis=_clip(analysis, limits["analysis"]))
    return {"task_block": block, "task_name": task.name, "language": task.spec.language, "task_spec": spec,
            "task_summary": spec, "reference": reference, "seed_section": seed}


def _seed_section(task: Task, wm: WorldModel, limit: int) -> str:
    """The planner's view of the root's code: the seed and its measured score (fixed for the run)."""
    if not task.seed_source or not limit:
        return ""
    root = wm.nodes["root"].attachment
    measured = f" (measured: score {root.score:.4g}x vs. the reference)" if root else ""
    return f"# Seed solution, attached to the root{measured}\n```python\n{_clip(task.seed_source, limit)}\n```\n"


def _attempt_lines(attempts: list[dict]) -> str:
    def line(a: dict) -> str:
        text = f"- {a['id']} ({a['prompt_kind']}): {a['status']}"
        if a["status"] == "passed" and a["latency_us"]:
            return text + f", score {a['score']:.4g}x, {a['latency_us']:.4g} us"
        return text + (f": {headline(a.get('log'))}" if headline(a.get("log")) else "")

    return "\n".join(line(a) for a in attempts)


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
             schema: type[EditScript] = EditScript, *, after_cycle: bool = False) -> tuple[EditScript, Usage]:
        """Ask with the user prompt ``build(limits)``, its pieces cut to fit the context. The rules for updating
        after a cycle are part of every planner call's system message (the head a provider's cache reuses), but
        only of an update's where the context is small."""
        system = prompt("planner_system")
        if after_cycle or not self.budget.compact:
            system += "\n" + prompt("planner_after_cycle")
        _, user = fit_prompt(lambda limits: [system, build(limits)], pieces, self.budget)
        ledger = TokenLedger()
        client = LLMClient(self.settings, "planner", ledger, chat_model=self.chat_model)
        messages = [SystemMessage(content=system), HumanMessage(content=user)]
        try:
            script, _ = client.structured(messages, schema)
        except StructuredOutputError as e:
            raise PlannerOutputError(e.errors, _usage(ledger, client)) from None
        return script, _usage(ledger, client)

    def initial(self, task: Task, wm: WorldModel, *, errors: list[str], sol: SpeedOfLight | None = None):
        def build(limits):
            return prompt("init_world_model", **self._fields(task, wm, limits, sol, analysis=""),
                          errors_section=_errors_section(errors))

        return self._ask(build, self._pieces(task, ""), InitScript)

    def _fields(self, task: Task, wm: WorldModel, limits: dict[str, int], sol, *, analysis: str) -> dict:
        return _task_fields(task, limits, sol, analysis, _seed_section(task, wm, limits["seed"]))

    def _pieces(self, task: Task, analysis: str, **more: int) -> dict[str, int]:
        return {**_task_pieces(task, self.budget, analysis), "seed": len(task.seed_source or ""), **more}

    def after_cycle(self, task: Task, wm: WorldModel, evidence: Evidence, *, errors: list[str],
                    sol: SpeedOfLight | None = None):
        b = evidence.best
        observed = f"{b['score'] / evidence.parent_score:.3g}x vs. the parent" if evidence.parent_score else \
            f"score {b['score']:.4g}x vs. the reference"
        code = _files_block(evidence.best_files)
        table = performance_table(evidence.best_result, sol, parent=evidence.parent_result) \
            if evidence.best_result else ""
        performance = f"\n# Performance of {b['id']}, per workload\n{table}\n" if table else ""

        def outcome(limits):
            return f"\n# The cycle's best code ({b['id']}, now attached to {evidence.node_id})\n```\n{_clip(code, limits['outcome'])}\n```\n"

        instructions = f"An attempt passed: node {evidence.node_id} is now closed (see \"After each cycle\")."
        return self._update(task, wm, evidence, observed, performance, outcome, len(code), instructions, errors, sol)

    def too_hard(self, task: Task, wm: WorldModel, evidence: Evidence, *, errors: list[str],
                 sol: SpeedOfLight | None = None):
        log = evidence.last_log[: _COMPACT_LOG_CHARS if self.budget.compact else _LOG_CHARS]
        code = _files_block(evidence.last_failed_files)
        table = performance_table(evidence.parent_result, sol) if evidence.parent_result else ""
        performance = f"\n# Performance of the code the action started from, per workload\n{table}\n" if table else ""

        def outcome(limits):
            # The code and its failure both: was the idea wrong, or only its implementation?
            share = limits["outcome"]
            shown = _clip(code, max(0, share - min(len(log), share // 3))) if code else ""
            text = f"\n# No attempt passed. The last failed attempt ({evidence.last_failed_id or '?'})\n"
            if shown:
                text += f"```\n{shown}\n```\n"
            return text + f"Its failure:\n```\n{_clip(log, max(0, share - len(shown)))}\n```\n"

        instructions = (f"No attempt passed: the action on {evidence.node_id} was too hard as stated (see \"After "
                        "each cycle\"): was the idea wrong, or only its implementation?")
        return self._update(task, wm, evidence, "no passing attempt", performance, outcome, len(code) + len(log),
                            instructions, errors, sol)

    def refill(self, task: Task, wm: WorldModel, *, errors: list[str], sol: SpeedOfLight | None = None,
               best: tuple[str, EvalResult] | None = None):
        """New actions for a weak frontier, asked at a cycle's start (the reference's refill step)."""
        budget = self.budget
        render_chars = min(self.render_chars, _COMPACT_RENDER_CHARS) if budget.compact else self.render_chars
        table = performance_table(best[1], sol) if best else ""
        best_section = f"\n# The best kernel so far ({best[0]}), per workload\n{table}\n" if table else ""
        values = [n.action.value for n in wm.frontier()]
        state = (f"The frontier is weak: its best action has value {max(values):.2g} (none above {WEAK_VALUE})."
                 if values else "The frontier is empty: no open action can be selected.")

        def build(limits):
            view = render(wm, budget_chars=limits["world_model"]) if limits["world_model"] else ""
            return prompt("refill_world_model", **self._fields(task, wm, limits, sol, analysis=wm.analysis),
                          world_model=view, best_section=best_section, frontier_state=state,
                          errors_section=_errors_section(errors))

        return self._ask(build, self._pieces(task, wm.analysis, world_model=render_chars))

    def _update(self, task, wm, evidence, observed, performance, outcome, outcome_chars, instructions, errors, sol):
        action = wm.nodes[evidence.node_id].action
        budget = self.budget
        render_chars = min(self.render_chars, _COMPACT_RENDER_CHARS) if budget.compact else self.render_chars
        note = (f"\nThe frontier is weak (no open action has value above {WEAK_VALUE}): add new actions worth trying "
                "and re-score the open ones.\n") if weak_frontier(wm) else ""

        def build(limits):
            # The world model is cut by re-rendering it with a smaller budget: whole nodes, never half a line.
            view = render(wm, budget_chars=limits["world_model"], focus=evidence.node_id) if limits["world_model"] else ""
            return prompt(
                "update_world_model", **self._fields(task, wm, limits, sol, analysis=wm.analysis), world_model=view,
                node_id=evidence.node_id, action_title=action.title, action_description=action.description,
                predicted_gain=action.predicted_gain, observed=observed, attempts=_attempt_lines(evidence.attempts),
                performance_section=performance, outcome_section=outcome(limits), instructions=instructions,
                frontier_note=note, errors_section=_errors_section(errors),
            )

        return self._ask(build, self._pieces(task, wm.analysis, world_model=render_chars, outcome=outcome_chars),
                         after_cycle=True)


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
        history = self._history(request, _HISTORY_CHARS)
        pieces = {**_task_pieces(task, budget, request.analysis),
                  "base": len(_files_block(self._start(request)[0]) or task.seed_source or ""),
                  "best": len(_files_block(request.base_files)) if request.kind == "improve" else 0,
                  "last": len(_files_block(request.last_files)), "feedback": len(feedback), "history": len(history)}
        _, user = fit_prompt(lambda limits: [system, self._user_prompt(request, limits, feedback)], pieces, budget)
        ledger = TokenLedger()
        client = LLMClient(self.settings, "coder", ledger, chat_model=self.chat_model)
        text, _ = client.text([SystemMessage(content=system), HumanMessage(content=user)])
        try:
            files = extract_code(text, language=task.spec.language, default_file=task.spec.solution_file)
        except CodeExtractionError as e:
            return CodeAnswer(files={}, usage=_usage(ledger, client), error=f"no usable code in the answer: {e}")
        return CodeAnswer(files=files, usage=_usage(ledger, client))

    @staticmethod
    def _start(request: CodeRequest) -> tuple[dict[str, str] | None, dict | None]:
        """The code the cycle started from and its summary (improve's ``base_files`` is the cycle's best)."""
        if request.kind == "improve":
            return request.start_files, request.start_summary
        return request.base_files, request.base_summary

    @staticmethod
    def _shows_last(request: CodeRequest) -> bool:
        """Whether the prompt shows the last attempt whole (debug; improve when the last is not the best)."""
        if request.kind == "debug":
            return True
        return bool(request.kind == "improve" and request.last_summary
                    and request.last_summary["id"] != request.base_summary["id"])

    @classmethod
    def _history(cls, request: CodeRequest, limit: int) -> str:
        if request.kind == "first" or not request.history:
            return ""
        sources = {h["id"]: f for h, f in zip(request.history, request.history_files)}
        for summary, files in ((request.base_summary, request.base_files), (request.start_summary, request.start_files)):
            if summary and files:
                sources.setdefault(summary.get("id"), files)
        return history_section(request.history, [sources.get(h.get("derived_from")) for h in request.history],
                               request.history_files, skip_last=cls._shows_last(request), limit=limit)

    @classmethod
    def _user_prompt(cls, request: CodeRequest, limits: dict[str, int], feedback: str) -> str:
        task = request.task
        a = request.action
        fields = {**_task_fields(task, limits, request.sol, request.analysis), "action_title": a["title"],
                  "action_description": a["description"], "action_rationale": a.get("rationale", ""),
                  "feedback": _clip(feedback, limits["feedback"]),
                  "history_section": cls._history(request, limits["history"])}
        # Every prompt of a cycle shows the code it started from in the same words, right after the action: the
        # cycle's prompts then share it as a cached prefix (improve shows its best version after it).
        start, start_summary = cls._start(request)
        if start:
            base = (f"# Start from this code (score {start_summary.get('score') or 0:.4g}x)\n```\n"
                    f"{_files_block(start, limits['base'])}\n```\n")
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
        if cls._shows_last(request):
            last = (f"\nThe last attempt ({request.last_summary['id']}: {request.last_summary['status']}):\n```\n"
                    f"{_files_block(request.last_files, limits['last'])}\n```\n")
        return prompt("code_improve", **fields, base_section=base, best_id=request.base_summary["id"],
                      best_score=f"{request.base_summary['score']:.4g}",
                      best_code=_files_block(request.base_files, limits["best"]), last_section=last)


def make_llm_agents(config: SearchConfig) -> tuple[LLMPlanner, LLMCoder]:
    if config.planner_llm is None or config.coder_llm is None:
        raise ValueError("an LLM search needs planner_llm and coder_llm settings")
    return (LLMPlanner(config.planner_llm, render_chars=config.world_model_render_chars),
            LLMCoder(config.coder_llm))
