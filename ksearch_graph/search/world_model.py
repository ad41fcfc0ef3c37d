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
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

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


# ----------------------------------------------------------------------------- edit scripts


# Ops reject unknown fields: an update with a misspelt field (say "V" or "gain", the short names
# render() shows) would otherwise be accepted as a silent no-op instead of fed back to the planner.
_STRICT = ConfigDict(extra="forbid")


class Reflection(BaseModel):
    """The reflection the update must write into the node it learned about (docs/method.md, "The loop", step 5)."""

    current: str = Field(min_length=1, max_length=1500, description="what the code does now and its bottleneck")
    follow_through: str = Field(min_length=1, max_length=1000, description="did the code implement the intent?")
    update_belief: str = Field(min_length=1, max_length=1000, description="what changed in our beliefs, next bet")
    perf_gap: str = Field(min_length=1, max_length=1000, description="predicted vs observed gain and why")


class InsertOp(BaseModel):
    model_config = _STRICT

    op: Literal["insert"]
    parent: str = Field(description="id of an existing node, or the ref of a node inserted earlier in this script")
    ref: str | None = Field(None, description="optional local name other ops of this script can use as parent")
    kind: Literal["open", "decision"] = "open"
    action: Action
    rating: float = Field(5.0, ge=0, le=10)
    confidence: float = Field(0.5, ge=0, le=1)


class UpdateOp(BaseModel):
    model_config = _STRICT

    op: Literal["update"]
    node: str
    value: float | None = Field(None, ge=0, le=1)
    difficulty: int | None = Field(None, ge=1, le=5)
    predicted_gain: float | None = Field(None, gt=0, le=100)
    title: str | None = Field(None, min_length=1, max_length=120)
    description: str | None = Field(None, min_length=1, max_length=2000)
    rationale: str | None = Field(None, max_length=1000)
    rating: float | None = Field(None, ge=0, le=10)
    confidence: float | None = Field(None, ge=0, le=1)
    impact: dict[str, str] | None = None
    note: str | None = Field(None, max_length=2000)


class PruneOp(BaseModel):
    model_config = _STRICT

    op: Literal["prune"]
    node: str
    reason: str = Field("", max_length=500)


class SplitOp(BaseModel):
    """Turn an open node into a decision node whose children are smaller or alternative actions."""

    model_config = _STRICT

    op: Literal["split"]
    node: str
    into: list[Action] = Field(min_length=2, max_length=3)


EditOp = Annotated[InsertOp | UpdateOp | PruneOp | SplitOp, Field(discriminator="op")]


class EditScript(BaseModel):
    analysis: str = Field("", max_length=4000, description="only at initialisation: the analysis of the task")
    reflection: Reflection | None = None
    ops: list[EditOp] = Field(default_factory=list, max_length=20)


class EditRejected(ValueError):
    def __init__(self, errors: list[str]):
        super().__init__("; ".join(errors))
        self.errors = errors


def parse_edit_script(data: Any) -> EditScript:
    """Validate a raw LLM answer; raise EditRejected with readable messages."""
    try:
        return EditScript.model_validate(data)
    except ValidationError as e:
        raise EditRejected(
            [f"{'.'.join(str(p) for p in err['loc']) or '(script)'}: {err['msg']}" for err in e.errors()]
        ) from None


def apply_edits(
    wm: WorldModel,
    script: EditScript,
    *,
    reflect_on: str | None = None,
    max_new_nodes: int = MAX_NEW_NODES,
) -> WorldModel:
    """Apply ``script`` atomically: returns a new tree, or raises EditRejected (``wm`` is never touched).

    ``reflect_on``: the node the cycle just worked on; the script must carry a reflection, which is
    appended to that node's notes.
    """
    new = wm.model_copy(deep=True)
    errors: list[str] = []
    refs: dict[str, str] = {}
    created: list[str] = []

    def resolve(name: str) -> str | None:
        # A ref may name a node that an earlier op of this script pruned: it no longer exists.
        nid = refs.get(name, name)
        return nid if nid in new.nodes else None

    for i, op in enumerate(script.ops):
        where = f"ops[{i}] ({op.op})"
        if isinstance(op, InsertOp):
            parent = resolve(op.parent)
            if parent is None:
                errors.append(f"{where}: parent '{op.parent}' does not exist")
                continue
            # An open parent is allowed: that makes a chain, whose step 2 waits for step 1 to close.
            if op.ref and (op.ref in refs or op.ref in new.nodes):
                errors.append(f"{where}: ref '{op.ref}' is already used")
                continue
            nid = new._new_id()
            new.nodes[nid] = Node(
                id=nid,
                parent=parent,
                kind=op.kind,
                action=op.action,
                beliefs=Beliefs(rating=op.rating, confidence=op.confidence),
            )
            created.append(nid)
            if op.ref:
                refs[op.ref] = nid
        elif isinstance(op, UpdateOp):
            nid = resolve(op.node)
            if nid is None:
                errors.append(f"{where}: node '{op.node}' does not exist")
                continue
            node = new.nodes[nid]
            action_fields = {
                k: getattr(op, k)
                for k in ("value", "difficulty", "predicted_gain", "title", "description", "rationale")
                if getattr(op, k) is not None
            }
            if action_fields:
                if node.action is None:
                    errors.append(f"{where}: node '{op.node}' ({node.kind}) has no action to update")
                    continue
                node.action = node.action.model_copy(update=action_fields)
            if op.rating is not None:
                node.beliefs.rating = op.rating
            if op.confidence is not None:
                node.beliefs.confidence = op.confidence
            if op.impact:
                node.beliefs.impact.update(op.impact)
            if op.note:
                node.beliefs.notes.append(op.note)
        elif isinstance(op, (PruneOp, SplitOp)):
            verb = "pruned" if isinstance(op, PruneOp) else "split"
            nid = resolve(op.node)
            if nid is None:
                errors.append(f"{where}: node '{op.node}' does not exist")
                continue
            node = new.nodes[nid]
            if node.kind != "open":
                errors.append(f"{where}: only open nodes can be {verb}; '{op.node}' is {node.kind}")
                continue
            if new.children(nid):
                # A split node's children would become alternatives, selectable before the step they
                # build on was implemented; a pruned node's children would be orphaned.
                errors.append(f"{where}: '{op.node}' has children (later steps); prune them first")
                continue
            if isinstance(op, PruneOp):
                del new.nodes[nid]
                continue
            node.kind = "decision"
            for action in op.into:
                cid = new._new_id()
                new.nodes[cid] = Node(id=cid, parent=nid, kind="open", action=action)
                created.append(cid)

    if len(created) > max_new_nodes:
        errors.append(f"the script creates {len(created)} nodes; at most {max_new_nodes} are allowed per update")
    if reflect_on is not None:
        if script.reflection is None:
            errors.append("reflection is missing: write CURRENT, FOLLOW_THROUGH, UPDATE_BELIEF and PERF_GAP")
        elif reflect_on in new.nodes:
            r = script.reflection
            new.nodes[reflect_on].beliefs.notes.append(
                f"CURRENT: {r.current}\nFOLLOW_THROUGH: {r.follow_through}\n"
                f"UPDATE_BELIEF: {r.update_belief}\nPERF_GAP: {r.perf_gap}"
            )
    if script.analysis:
        new.analysis = script.analysis
    errors.extend(check_invariants(wm, new))
    if errors:
        raise EditRejected(errors)
    return new


def check_invariants(before: WorldModel, after: WorldModel) -> list[str]:
    """Structural rules every committed tree obeys; ``before`` is the last committed tree."""
    errors = []
    root = after.nodes.get(ROOT)
    if root is None or root.kind != "root" or root.parent is not None:
        errors.append("the root node must stay intact")
    elif before.nodes[ROOT].attachment != root.attachment:
        errors.append("the root's attached seed solution cannot be changed")
    for nid, node in before.nodes.items():
        if node.attachment is not None:
            kept = after.nodes.get(nid)
            if kept is None or kept.attachment != node.attachment or kept.kind != node.kind:
                errors.append(f"node '{nid}' carries attempt {node.attachment.attempt_id}; it cannot be removed or changed")
    for nid, node in after.nodes.items():
        if nid != ROOT and node.parent not in after.nodes:
            errors.append(f"node '{nid}' has a parent '{node.parent}' that does not exist")
        if node.kind in ("open", "decision") and node.action is None:
            errors.append(f"node '{nid}' ({node.kind}) needs an action")
        if node.kind == "decision" and not after.children(nid):
            errors.append(f"decision node '{nid}' has no alternatives")
    # A solved (closed) node keeps at least one open continuation somewhere below it.
    for nid, node in after.nodes.items():
        if node.kind == "closed" and not _has_open_descendant(after, nid):
            errors.append(f"closed node '{nid}' needs at least one open child (a continuation of its success)")
    if not _is_acyclic(after):
        errors.append("the tree has a cycle")
    return errors


def _has_open_descendant(wm: WorldModel, nid: str) -> bool:
    stack, seen = [nid], {nid}  # ``seen``: a hand-edited tree may have a cycle (reported separately)
    while stack:
        for child in wm.children(stack.pop()):
            if child.kind == "open":
                return True
            if child.id not in seen:
                seen.add(child.id)
                stack.append(child.id)
    return False


def _is_acyclic(wm: WorldModel) -> bool:
    for nid in wm.nodes:
        seen = set()
        cur: str | None = nid
        while cur is not None:
            if cur in seen:
                return False
            seen.add(cur)
            cur = wm.nodes[cur].parent if cur in wm.nodes else None
    return True


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
    if _has_open_descendant(wm, node_id):
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
    # closed nodes by id (their lines rarely change), the frontier by V, the rest by id.
    out_order = list(dict.fromkeys([ROOT] + sorted(closed, key=_id_order) + frontier
                                   + sorted(wm.nodes, key=_id_order)))
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
