"""The offline planner and coder: K-Search's loop with no LLM, over a task's kernel template.

This is the no-LLM baseline, not K-Search's intelligence. It walks the same graph, edits the same
world model through the same atomic edit scripts, and its code goes through the same harness and
store, so a run without an API key is a real search, and "what does the LLM add" has an honest
answer: compare against this.

- Planner: starts with one action per algorithm variant of the template; after a cycle that passed,
  it proposes up to three one-knob moves from the cycle's best configuration (not tried before
  anywhere in the tree); after a failed cycle it down-scores the action, and prunes it once it has
  failed twice.
- Coder: renders the template. Attempt 1 uses the action's configuration; debug and improve attempts
  move one knob of the last (debug) or cycle-best (improve) configuration to a neighbouring value.

Every generated file starts with a header line holding its configuration, so the code itself says
what it is and the next step can start from it.
"""

from __future__ import annotations

import json
import random

from ksearch_graph.search.roles.protocol import CodeAnswer, CodeRequest, Evidence, Usage
from ksearch_graph.search.roles.template import default_params, render_template
from ksearch_graph.search.world_model import ROOT, Action, WorldModel
from ksearch_graph.search.world_model_edits import EditScript, InsertOp, PruneOp, Reflection, UpdateOp
from ksearch_graph.tasks.task import Task

HEADER = "# ksearch-offline template params: "
MOVE = "# ksearch-offline move: "  # the one-knob move that made this file, e.g. ["BLOCK_N", 1]
VARIANT = "VARIANT"


def params_of(files: dict[str, str] | None) -> dict:
    """The configuration a rendered file was made from ({} for code not made by the offline coder)."""
    for text in (files or {}).values():
        first = text.split("\n", 1)[0]
        if first.startswith(HEADER):
            return json.loads(first[len(HEADER):])
    return {}


def move_of(files: dict[str, str] | None) -> tuple[str, int] | None:
    for text in (files or {}).values():
        lines = text.split("\n", 2)
        if len(lines) > 1 and lines[1].startswith(MOVE):
            name, step = json.loads(lines[1][len(MOVE):])
            return name, step
    return None


def _step(task: Task, params: dict, name: str, step: int) -> dict | None:
    values = task.spec.template.parameters[name].values
    if params.get(name) not in values:
        return None
    j = values.index(params[name]) + step
    return {**params, name: values[j]} if 0 <= j < len(values) else None


def _describe(params: dict, task: Task) -> str:
    knobs = task.spec.template.parameters
    return ", ".join(f"{k}={params[k]}" for k in knobs if k in params)


def _neighbours(task: Task, params: dict, rng: random.Random, *, include_variant: bool = False,
                with_moves: bool = False) -> list:
    """Configurations one knob away from ``params``, in a shuffled but reproducible order."""
    out = []
    for name, knob in task.spec.template.parameters.items():
        if name == VARIANT and not include_variant:
            continue
        values = knob.values
        i = values.index(params[name]) if params.get(name) in values else values.index(knob.default)
        for j in (i - 1, i + 1):
            if 0 <= j < len(values):
                out.append(({**params, name: values[j]}, (name, j - i)))
    rng.shuffle(out)
    return [p for p, _ in out] if not with_moves else out


class OfflinePlanner:
    def __init__(self, seed: int = 0):
        self.seed = seed

    def _rng(self, key: str) -> random.Random:
        return random.Random(f"{self.seed}:{key}")

    def initial(self, task: Task, wm: WorldModel, *, errors: list[str], sol=None) -> tuple[EditScript, Usage]:
        template = _require_template(task)
        base = {**default_params(task), **params_of(_seed_files(task))}
        ops = []
        ranked = sorted(template.variants.items(), key=lambda kv: -kv[1].prior)
        for name, variant in ranked[:4]:
            params = {**base, VARIANT: name} if VARIANT in template.parameters else dict(base)
            ops.append(InsertOp(op="insert", parent=ROOT, action=Action(
                title=variant.title,
                description=f"{variant.description} Start from {_describe(params, task)}.",
                difficulty=variant.difficulty,
                value=variant.prior,
                predicted_gain=1.0,
                rationale="offline baseline: one action per algorithm family of the template",
                params=params,
            )))
        knobs = ", ".join(f"{k} in {v.values}" for k, v in template.parameters.items())
        analysis = (f"Offline (no-LLM) baseline over the template {template.file} of task {task.name}: "
                    f"families {list(template.variants)}; knobs {knobs}.")
        return EditScript(analysis=analysis, ops=ops), Usage()

    def after_cycle(self, task: Task, wm: WorldModel, evidence: Evidence, *, errors: list[str], sol=None):
        node = wm.nodes[evidence.node_id]
        params = params_of(evidence.best_files) or dict(node.action.params)
        score = evidence.best["score"]
        top = max((n.attachment.score for n in wm.nodes.values() if n.attachment), default=score) or 1.0
        rng = self._rng(evidence.cycle_id)
        tried = _configs_in_tree(wm)
        moves = [p for p in _neighbours(task, params, rng) if json.dumps(p, sort_keys=True) not in tried][:3]
        ops = []
        for move in moves:
            changed = next(k for k in move if move[k] != params.get(k))
            affects = task.spec.template.parameters[changed].affects
            ops.append(InsertOp(op="insert", parent=evidence.node_id, action=Action(
                title=f"{changed} {params.get(changed)} -> {move[changed]}",
                description=f"From {evidence.best['id']} ({_describe(params, task)}), set {changed}={move[changed]}"
                            + (f" ({affects})" if affects else "") + ".",
                difficulty=1,
                value=round(min(0.95, max(0.05, 0.3 + 0.5 * score / top + rng.uniform(-0.05, 0.05))), 3),
                predicted_gain=1.1,
                rationale="offline baseline: one-knob move from the cycle's best configuration",
                params=move,
            )))
        if not ops:  # every neighbour was tried: keep the rule "a solved node keeps an open child"
            ops.append(InsertOp(op="insert", parent=evidence.node_id, action=Action(
                title="Re-measure and retune around the best", description="Random one-knob moves around "
                f"{_describe(params, task)}.", difficulty=1, value=0.05, predicted_gain=1.02, params=params)))
        ops.append(UpdateOp(op="update", node=evidence.node_id, rating=round(10 * min(1.0, score / top), 2)))
        return EditScript(reflection=_reflection(evidence, task, params), ops=ops), Usage()

    def too_hard(self, task: Task, wm: WorldModel, evidence: Evidence, *, errors: list[str], sol=None):
        node = wm.nodes[evidence.node_id]
        reflection = _reflection(evidence, task, dict(node.action.params))
        # Prune after the second failed cycle; if the tree forbids it (the last open child of a solved
        # node), the rejection comes back in ``errors`` and we only down-score.
        if node.failures >= 2 and not any("prune" in e for e in errors):
            return EditScript(reflection=reflection, ops=[PruneOp(op="prune", node=node.id, reason="failed twice")]), Usage()
        return EditScript(reflection=reflection, ops=[UpdateOp(
            op="update", node=node.id, value=round(node.action.value * 0.5, 3),
            difficulty=min(5, node.action.difficulty + 1), rating=max(0.0, node.beliefs.rating - 2),
        )]), Usage()


def _reflection(evidence: Evidence, task: Task, params: dict) -> Reflection:
    if evidence.passed:
        b = evidence.best
        gain = f"{b['score'] / evidence.parent_score:.3g}x vs the parent" if evidence.parent_score else "no parent to compare"
        return Reflection(
            current=f"{b['id']} implements {_describe(params, task)}; score {b['score']:.4g}x vs the reference.",
            follow_through="The offline coder renders the template exactly, so the code implements the action.",
            update_belief="Explore one-knob moves around this configuration next.",
            perf_gap=f"Predicted 1.1x vs the parent; observed {gain}.",
        )
    statuses = ", ".join(sorted({a["status"] for a in evidence.attempts}))
    return Reflection(
        current=f"No attempt passed ({statuses}).",
        follow_through="The template was rendered as asked; the configuration itself fails.",
        update_belief="Down-score this family/configuration." + (f" Last log: {evidence.last_log[:200]}" if evidence.last_log else ""),
        perf_gap="Predicted a pass; observed failures.",
    )


def _require_template(task: Task):
    if task.spec.template is None:
        raise ValueError(f"task {task.name} ships no template; the offline planner needs one (use an LLM planner)")
    return task.spec.template


def _seed_files(task: Task) -> dict[str, str] | None:
    return {task.spec.solution_file: task.seed_source} if task.seed_source else None


def _configs_in_tree(wm: WorldModel) -> set[str]:
    return {json.dumps(n.action.params, sort_keys=True) for n in wm.nodes.values() if n.action and n.action.params}


class OfflineCoder:
    def __init__(self, seed: int = 0):
        self.seed = seed

    def write(self, request: CodeRequest) -> CodeAnswer:
        task = request.task
        _require_template(task)
        rng = random.Random(f"{self.seed}:{request.attempt_id}")
        if request.kind == "first":
            params = {**default_params(task), **params_of(request.base_files), **request.action.get("params", {})}
            return CodeAnswer(files=self._render(task, params), usage=Usage())
        # Debug and improve: a one-knob move from the last (debug) or cycle-best (improve) configuration,
        # never one this cycle already tried. Improve first continues the move that made the best
        # (coordinate search with momentum), then tries the other moves in a seeded random order.
        start = request.base_files if request.kind == "improve" else request.last_files
        params = {**default_params(task), **params_of(start)}
        tried = {json.dumps(params_of(files), sort_keys=True) for files in request.history_files}
        candidates = _neighbours(task, params, rng, with_moves=True)
        momentum = move_of(start) if request.kind == "improve" else None
        if momentum and (ahead := _step(task, params, *momentum)) is not None:
            candidates.insert(0, (ahead, momentum))
        fresh = [c for c in candidates if json.dumps(c[0], sort_keys=True) not in tried]
        chosen, move = (fresh or candidates or [(params, None)])[0]
        return CodeAnswer(files=self._render(task, chosen, move), usage=Usage())

    @staticmethod
    def _render(task: Task, params: dict, move: tuple[str, int] | None = None) -> dict[str, str]:
        files = render_template(task, params)
        name = task.spec.solution_file
        header = HEADER + json.dumps(params, sort_keys=True) + "\n"
        if move is not None:
            header += MOVE + json.dumps(list(move)) + "\n"
        files[name] = header + files[name]
        return files
