"""The planner's edits of the world model: an ``EditScript`` of insert / update / prune / split operations, applied
to a copy of the tree by ``apply_edits``, which checks the tree's invariants and returns either the new tree or
readable errors to feed back to the planner (docs/method.md, "The world model")."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ksearch_graph.search.world_model import (
    MAX_NEW_NODES,
    ROOT,
    Action,
    Beliefs,
    Node,
    WorldModel,
    has_open_descendant,
)

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
        if node.kind == "closed" and not has_open_descendant(after, nid):
            errors.append(f"closed node '{nid}' needs at least one open child (a continuation of its success)")
    if not _is_acyclic(after):
        errors.append("the tree has a cycle")
    return errors


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
