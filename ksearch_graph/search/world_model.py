"""The world model: a tree of optimisation hypotheses that the planner edits as evidence comes in.

Nodes (docs/method.md, "The world model"):
- the ``root`` is the task itself (optionally with a seed solution attached),
- a ``closed`` node is an implemented optimisation; it carries the best attempt of its cycle,
- an ``open`` node is a proposed next step (an ``Action``) not implemented yet,
- a ``decision`` node groups mutually exclusive alternatives (its children).

The planner never mutates the tree directly. It emits an ``EditScript`` (insert / update / prune /
split); ``apply_edits`` applies it to a copy, checks the invariants, and either returns the new tree
or a list of readable errors to feed back to the planner. Closing a node and attaching an attempt is
bookkeeping done by the graph (``close_node``), not something the planner can forge.

The tree is stored in graph state as plain JSON (``WorldModel.model_dump(mode="json")``).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, Field

ROOT = "root"
MAX_NEW_NODES = 3  # per edit script after initialisation (docs/method.md)
MAX_INIT_NODES = 8


# ----------------------------------------------------------------------------- node contents


class Action(BaseModel):
    """What an open node proposes to do next. Sized to one cycle of implementation."""

    title: str = Field(min_length=1, max_length=120)
    description: str = Field(min_length=1, max_length=2000)
    difficulty: int = Field(ge=1, le=5)
    value: float = Field(ge=0, le=1, description="priority score V: how promising this step is")
    predicted_gain: float = Field(gt=0, le=100, description="expected speed factor vs. the parent (1.2 = 20% faster)")
    rationale: str = Field("", max_length=1000)
    # Machine-readable knobs (the offline planner sets template parameters here; an LLM may leave it empty).
    params: dict[str, Any] = {}


class Beliefs(BaseModel):
    """The planner's current opinion of a node."""

    rating: float = Field(5.0, ge=0, le=10)
    confidence: float = Field(0.5, ge=0, le=1)
    impact: dict[str, str] = {}  # e.g. memory_bandwidth / register_pressure / hardware_fit -> short note
    notes: list[str] = []  # reflections, newest last


class Attachment(BaseModel):
    """The best attempt of a closed node's cycle. Written by the graph, immutable afterwards."""

    attempt_id: str
    source_hash: str
    status: str
    score: float
    latency_us: float | None = None


class Node(BaseModel):
    id: str
    parent: str | None
    kind: Literal["root", "open", "closed", "decision"]
    action: Action | None = None
    beliefs: Beliefs = Beliefs()
    attachment: Attachment | None = None
    # Bookkeeping for the failure-aware policy: cycles run on this node, and cycles that passed nothing.
    visits: int = 0
    failures: int = 0


class WorldModel(BaseModel):
    nodes: dict[str, Node]
    next_id: int = 1
    analysis: str = ""  # the planner's analysis of the task from initialisation

    # ------------------------------------------------------------------ construction and views

    @classmethod
    def new(cls, task_title: str) -> WorldModel:
        root = Node(id=ROOT, parent=None, kind="root", action=None)
        root.beliefs.notes.append(f"task: {task_title}")
        return cls(nodes={ROOT: root})

    @classmethod
    def from_state(cls, data: dict) -> WorldModel:
        return cls.model_validate(data)

    def to_state(self) -> dict:
        return self.model_dump(mode="json", exclude_defaults=False)

    def children(self, node_id: str) -> list[Node]:
        return [n for n in self.nodes.values() if n.parent == node_id]

    def frontier(self) -> list[Node]:
        """Open nodes whose nearest non-decision ancestor is closed or the root.

        Decision nodes are transparent: an alternative under a decision hanging off a closed node
        is selectable. Step 2 of a chain becomes selectable only once step 1 is closed.
        """
        out = []
        for node in self.nodes.values():
            if node.kind != "open":
                continue
            parent = self.nodes[node.parent]
            while parent.kind == "decision":
                parent = self.nodes[parent.parent]
            if parent.kind in ("closed", "root"):
                out.append(node)
        return out

    def code_parent(self, node_id: str) -> Node:
        """The nearest ancestor that carries code (closed) or the root: the base of an action."""
        parent = self.nodes[self.nodes[node_id].parent]
        while parent.kind == "decision":
            parent = self.nodes[parent.parent]
        return parent

    def path(self, node_id: str) -> list[Node]:
        out = []
        cur: str | None = node_id
        while cur is not None:
            out.append(self.nodes[cur])
            cur = self.nodes[cur].parent
        return out[::-1]

    def _new_id(self) -> str:
        nid = f"n{self.next_id}"
        self.next_id += 1
        return nid


# ----------------------------------------------------------------------------- graph bookkeeping


def close_node(wm: WorldModel, node_id: str, attachment: Attachment) -> WorldModel:
    """Mark ``node_id`` implemented and attach its cycle's best attempt. Done by the graph, not the LLM."""
    new = wm.model_copy(deep=True)
    node = new.nodes[node_id]
    node.kind = "closed"
    node.attachment = attachment
    return new


def record_visit(wm: WorldModel, node_id: str, *, failed: bool) -> WorldModel:
    new = wm.model_copy(deep=True)
    if node_id in new.nodes:
        new.nodes[node_id].visits += 1
        new.nodes[node_id].failures += int(failed)
    return new


def ensure_continuation(wm: WorldModel, node_id: str) -> WorldModel:
    """Fallback when the planner's edits were all rejected: keep the 'solved node has an open child' rule."""
    if has_open_descendant(wm, node_id):
        return wm
    new = wm.model_copy(deep=True)
    nid = new._new_id()
    title = new.nodes[node_id].action.title if new.nodes[node_id].action else "the current best"
    new.nodes[nid] = Node(
        id=nid,
        parent=node_id,
        kind="open",
        action=Action(
            title=f"Refine: {title}"[:120],
            description="Profile the current kernel and tune its launch parameters and tiling.",
            difficulty=2,
            value=0.3,
            predicted_gain=1.05,
            rationale="Added automatically because the planner's update was rejected.",
        ),
    )
    return new


# ----------------------------------------------------------------------------- prompt rendering


# Detail levels of an open node's line: (description chars, note chars); None drops the field.
_DETAIL = {"full": (300, 400), "short": (120, 160), "bare": (None, None)}
FRONTIER_SHARE = 2 / 3  # of the budget, that the frontier's detail level is chosen to fit in


def render(wm: WorldModel, *, budget_chars: int = 6000, focus: str | None = None) -> str:
    """A compact, prompt-sized view of the tree: one complete JSON object per line.

    The whole frontier is always shown (the planner re-scores it): at the richest detail that fits in two thirds of
    the budget, bare (title and numbers) if none does, even past the budget. The other nodes fill what is left in
    order of usefulness (the focus node's path, closed nodes by score, the rest). A view that drops nodes says how
    many in its last line. No JSON is ever cut mid-structure.
    """
    frontier = [n.id for n in sorted(wm.frontier(), key=lambda n: (-n.action.value, n.id))]
    head = [ROOT] + ([n.id for n in wm.path(focus)] if focus and focus in wm.nodes else [])
    closed = [n.id for n in sorted((n for n in wm.nodes.values() if n.kind == "closed"),
                                   key=lambda n: -(n.attachment.score if n.attachment else 0))]
    order = list(dict.fromkeys(head + frontier + closed + list(wm.nodes)))
    mandatory = set(frontier) | {ROOT}

    def line(nid: str, detail: str = "full") -> str:
        return json.dumps(_compact(wm.nodes[nid], detail), separators=(",", ":"), ensure_ascii=False)

    # Lines go out in an order that changes little from one update to the next (a stable prompt prefix): the root,
    # then every node by id (creation order): a new node comes last, a closed or re-scored one changes in place.
    out_order = list(dict.fromkeys([ROOT] + sorted(wm.nodes, key=_id_order)))
    every = {nid: line(nid) for nid in out_order}
    if sum(len(text) + 1 for text in every.values()) - 1 <= budget_chars:
        return "\n".join(every.values())
    trailer = len(f"... {len(wm.nodes)} more nodes not shown (lower priority)")
    for detail in _DETAIL:
        shown = {nid: line(nid, detail) for nid in frontier}
        size = sum(len(text) + 1 for text in shown.values())
        if size <= budget_chars * FRONTIER_SHARE and size + len(every[ROOT]) + 1 + trailer <= budget_chars:
            break
    shown[ROOT] = every[ROOT]
    used = sum(len(text) + 1 for text in shown.values()) + trailer
    for nid in order:
        if nid not in mandatory and used + len(every[nid]) + 1 <= budget_chars:
            shown[nid] = every[nid]
            used += len(every[nid]) + 1
    lines = [shown[nid] for nid in out_order if nid in shown]
    omitted = len(wm.nodes) - len(lines)
    if omitted:
        lines.append(f"... {omitted} more nodes not shown (lower priority)")
    return "\n".join(lines)


def _id_order(nid: str) -> tuple[int, str]:
    """n2 before n10; the root and odd ids first."""
    return (int(nid[1:]), nid) if nid[1:].isdigit() else (-1, nid)


def _compact(node: Node, detail: str = "full") -> dict:
    description, note = _DETAIL[detail]
    out: dict[str, Any] = {"id": node.id, "parent": node.parent, "kind": node.kind}
    if node.action:
        a = node.action
        out.update(title=a.title, V=a.value, difficulty=a.difficulty, gain=a.predicted_gain)
        if node.kind == "open" and description:
            out["description"] = a.description[:description]
    out["rating"] = node.beliefs.rating
    if node.attachment:
        out["attempt"] = node.attachment.attempt_id
        out["score"] = node.attachment.score
    if node.visits:
        out["visits"], out["failures"] = node.visits, node.failures
    if node.beliefs.notes and note:
        out["last_note"] = node.beliefs.notes[-1][:note]
    return out


def has_open_descendant(wm: WorldModel, nid: str) -> bool:
    stack, seen = [nid], {nid}  # ``seen``: a hand-edited tree may have a cycle (reported separately)
    while stack:
        for child in wm.children(stack.pop()):
            if child.kind == "open":
                return True
            if child.id not in seen:
                seen.add(child.id)
                stack.append(child.id)
    return False
