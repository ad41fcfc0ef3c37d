"""The world model: tree semantics, edit scripts (atomic, validated), rendering, graph bookkeeping.

Includes a seeded random fuzz of edit scripts (no extra dependency): every script is either
rejected with the tree untouched or accepted with all invariants holding.
"""

from __future__ import annotations

import copy
import json
import random
import re
import signal

import pytest

from ksearch_graph.search.policy import select_actions
from ksearch_graph.search.world_model import (
    MAX_INIT_NODES,
    MAX_NEW_NODES,
    ROOT,
    Action,
    Attachment,
    Beliefs,
    Node,
    WorldModel,
    close_node,
    ensure_continuation,
    record_visit,
    render,
)
from ksearch_graph.search.world_model_edits import (
    EditRejected,
    EditScript,
    apply_edits,
    check_invariants,
    parse_edit_script,
)

# ----------------------------------------------------------------------------- helpers


def act(title: str = "act", *, value: float = 0.5, difficulty: int = 2, gain: float = 1.2, **extra) -> dict:
    return {"title": title, "description": f"do {title}", "difficulty": difficulty, "value": value,
            "predicted_gain": gain, **extra}


def ins(parent: str, title: str = "act", *, ref: str | None = None, kind: str = "open", **kw) -> dict:
    op = {"op": "insert", "parent": parent, "kind": kind, "action": act(title, **kw)}
    if ref is not None:
        op["ref"] = ref
    return op


REFLECTION = {"current": "tiled kernel, memory bound", "follow_through": "yes", "update_belief": "tiling helps",
              "perf_gap": "predicted 1.3x, observed 1.2x"}


def script(*ops: dict, reflection: dict | None = None, analysis: str = "") -> EditScript:
    data: dict = {"ops": list(ops)}
    if reflection is not None:
        data["reflection"] = reflection
    if analysis:
        data["analysis"] = analysis
    return parse_edit_script(data)


def apply(wm: WorldModel, *ops: dict, **kw) -> WorldModel:
    reflection = kw.pop("reflection", None)
    return apply_edits(wm, script(*ops, reflection=reflection), **kw)


def attachment(aid: str = "a1", score: float = 1.5) -> Attachment:
    return Attachment(attempt_id=aid, source_hash=f"h-{aid}", status="passed", score=score, latency_us=10.0)


def rejected(wm: WorldModel, *ops: dict, **kw) -> list[str]:
    """Apply ops expecting a rejection; asserts the tree is untouched and returns the errors."""
    before = wm.model_dump()
    with pytest.raises(EditRejected) as exc:
        apply(wm, *ops, **kw)
    assert wm.model_dump() == before, "a rejected script must leave the tree untouched"
    errors = exc.value.errors
    assert errors and all(isinstance(e, str) and e for e in errors)
    assert str(exc.value) == "; ".join(errors)
    return errors


def has_error(errors: list[str], pattern: str) -> bool:
    return any(re.search(pattern, e) for e in errors)


def frontier_ids(wm: WorldModel) -> set[str]:
    return {n.id for n in wm.frontier()}


@pytest.fixture
def tree() -> WorldModel:
    """root
    |- n1 open "A"
    |- n2 closed "B" (attempt a1)
    |   |- n4 open "B2"            (continuation of B)
    |   |- n5 decision "family"
    |   |   |- n6 open "alt1"
    |   |   |   |- n8 open "alt1 step2"   (chain: not selectable)
    |   |   |- n7 open "alt2"
    |- n3 open "C"
    """
    wm = WorldModel.new("gqa decode")
    wm = apply(wm, ins(ROOT, "A", ref="a"), ins(ROOT, "B", ref="b", value=0.9), ins(ROOT, "C", ref="c"),
               ins("b", "B2"), max_new_nodes=MAX_INIT_NODES)
    wm = close_node(wm, "n2", attachment("a1"))
    wm = apply(wm, ins("n2", "family", ref="d", kind="decision"), ins("d", "alt1"), ins("d", "alt2"),
               reflect_on="n2", reflection=REFLECTION)
    wm = apply(wm, ins("n6", "alt1 step2"))
    assert check_invariants(wm, wm) == []
    return wm


# ----------------------------------------------------------------------------- construction and views


def test_new_tree_has_only_the_root():
    wm = WorldModel.new("my task")
    assert list(wm.nodes) == [ROOT]
    root = wm.nodes[ROOT]
    assert (root.id, root.parent, root.kind, root.action, root.attachment) == (ROOT, None, "root", None, None)
    assert root.beliefs.notes == ["task: my task"]
    assert wm.next_id == 1 and wm.analysis == ""
    assert wm.frontier() == []
    assert check_invariants(wm, wm) == []


def test_new_trees_share_no_mutable_defaults():
    a, b = WorldModel.new("a"), WorldModel.new("b")
    a.nodes[ROOT].beliefs.notes.append("x")
    a.nodes[ROOT].beliefs.impact["k"] = "v"
    assert b.nodes[ROOT].beliefs.notes == ["task: b"] and b.nodes[ROOT].beliefs.impact == {}
    assert Node(id="q", parent=ROOT, kind="open").beliefs == Beliefs()


def test_state_round_trip(tree):
    state = tree.to_state()
    assert json.loads(json.dumps(state)) == state  # plain JSON
    back = WorldModel.from_state(state)
    assert back == tree and back.to_state() == state
    assert WorldModel.model_validate_json(tree.model_dump_json()) == tree


def test_children_path_and_code_parent(tree):
    assert {n.id for n in tree.children(ROOT)} == {"n1", "n2", "n3"}
    assert {n.id for n in tree.children("n5")} == {"n6", "n7"}
    assert tree.children("n8") == []
    assert [n.id for n in tree.path("n8")] == [ROOT, "n2", "n5", "n6", "n8"]
    assert [n.id for n in tree.path(ROOT)] == [ROOT]
    assert tree.code_parent("n6").id == "n2"  # through the decision node
    assert tree.code_parent("n1").id == ROOT
    assert tree.code_parent("n8").id == "n6"


# ----------------------------------------------------------------------------- frontier


def test_frontier_semantics(tree):
    # n1, n3 under the root; n4 under closed n2; n6, n7 under a decision under n2. n8 waits for n6.
    assert frontier_ids(tree) == {"n1", "n3", "n4", "n6", "n7"}


def test_chain_step_two_selectable_only_after_step_one_closed():
    wm = apply(WorldModel.new("t"), ins(ROOT, "step1", ref="s1"), ins("s1", "step2", ref="s2"), ins("s2", "step3"))
    assert frontier_ids(wm) == {"n1"}
    wm = close_node(wm, "n1", attachment("a1"))
    assert frontier_ids(wm) == {"n2"}
    wm = close_node(wm, "n2", attachment("a2"))
    assert frontier_ids(wm) == {"n3"}
    assert check_invariants(wm, wm) == []


def test_decision_nodes_are_transparent():
    wm = apply(WorldModel.new("t"), ins(ROOT, "fam", ref="d", kind="decision"), ins("d", "x"), ins("d", "y"))
    assert frontier_ids(wm) == {"n2", "n3"}  # decision under the root
    wm = apply(wm, ins("n2", "sub", ref="d2", kind="decision"), ins("d2", "p"), ins("d2", "q"))
    assert frontier_ids(wm) == {"n2", "n3"}  # decision under an open node: its alternatives wait
    wm = close_node(wm, "n2", attachment())
    assert frontier_ids(wm) == {"n3", "n5", "n6"}  # decision under a closed node
    wm = apply(wm, ins("n4", "nested", ref="d3", kind="decision"), ins("d3", "r"), ins("d3", "s"))
    assert {"n8", "n9"} <= frontier_ids(wm)  # decision under decision under closed


def test_frontier_excludes_non_open_nodes(tree):
    kinds = {tree.nodes[i].kind for i in frontier_ids(tree)}
    assert kinds == {"open"}


# ----------------------------------------------------------------------------- insert


def test_insert_with_refs_allocates_sequential_ids():
    wm = WorldModel.new("t")
    new = apply(wm, ins(ROOT, "fam", ref="d", kind="decision", rating=7, confidence=0.9),
                ins("d", "x", ref="x"), ins("x", "x2"))
    assert wm.nodes.keys() == {ROOT}  # the input is never mutated
    assert new.next_id == 4
    assert (new.nodes["n1"].kind, new.nodes["n1"].parent) == ("decision", ROOT)
    assert (new.nodes["n2"].kind, new.nodes["n2"].parent) == ("open", "n1")
    assert (new.nodes["n3"].kind, new.nodes["n3"].parent) == ("open", "n2")
    assert new.nodes["n2"].action == Action(**act("x"))
    assert new.nodes["n2"].beliefs == Beliefs()


def test_insert_rating_and_confidence():
    op = ins(ROOT, "x")
    op.update(rating=8.5, confidence=0.25)
    new = apply(WorldModel.new("t"), op)
    assert (new.nodes["n1"].beliefs.rating, new.nodes["n1"].beliefs.confidence) == (8.5, 0.25)


def test_insert_params_round_trip():
    new = apply(WorldModel.new("t"), ins(ROOT, "x", params={"BLOCK": 64, "stages": [2, 3]}))
    assert new.nodes["n1"].action.params == {"BLOCK": 64, "stages": [2, 3]}
    assert WorldModel.from_state(new.to_state()) == new


def test_insert_refs_must_be_fresh(tree):
    errors = rejected(tree, ins(ROOT, "x", ref="a"), ins(ROOT, "y", ref="a"))
    assert has_error(errors, r"ops\[1\] \(insert\): ref 'a' is already used")
    errors = rejected(tree, ins(ROOT, "x", ref="n1"))
    assert has_error(errors, r"ref 'n1' is already used")
    errors = rejected(tree, ins(ROOT, "x", ref=ROOT))
    assert has_error(errors, r"ref 'root' is already used")


def test_insert_parent_must_exist(tree):
    errors = rejected(tree, ins("n99", "x"))
    assert errors == ["ops[0] (insert): parent 'n99' does not exist"]
    errors = rejected(tree, ins("later", "x"), ins(ROOT, "y", ref="later"))  # refs are not forward
    assert has_error(errors, r"parent 'later' does not exist")


def test_a_ref_to_a_pruned_node_is_rejected_not_a_crash():
    # Regression: resolve() returned the pruned node's id and the op raised KeyError.
    wm = WorldModel.new("t")
    for follow in ({"op": "update", "node": "a", "rating": 3}, ins("a", "child"),
                   {"op": "prune", "node": "a"}, {"op": "split", "node": "a", "into": [act("p"), act("q")]}):
        errors = rejected(wm, ins(ROOT, "x", ref="a"), ins(ROOT, "keep"), {"op": "prune", "node": "a"}, follow)
        assert has_error(errors, r"ops\[3\].*'a' does not exist"), errors


# ----------------------------------------------------------------------------- update


def test_update_action_fields_and_beliefs(tree):
    before = tree.nodes["n1"].model_copy(deep=True)
    new = apply(tree, {"op": "update", "node": "n1", "value": 0.1, "difficulty": 5, "predicted_gain": 2.5,
                       "title": "A'", "description": "new desc", "rationale": "why", "rating": 9,
                       "confidence": 0.8, "impact": {"memory_bandwidth": "saturated"}, "note": "looked again"})
    n = new.nodes["n1"]
    assert (n.action.value, n.action.difficulty, n.action.predicted_gain) == (0.1, 5, 2.5)
    assert (n.action.title, n.action.description, n.action.rationale) == ("A'", "new desc", "why")
    assert (n.beliefs.rating, n.beliefs.confidence) == (9, 0.8)
    assert n.beliefs.impact == {"memory_bandwidth": "saturated"}
    assert n.beliefs.notes == ["looked again"]
    assert tree.nodes["n1"] == before  # untouched input


def test_update_keeps_unmentioned_fields_and_merges_impact(tree):
    t1 = apply(tree, {"op": "update", "node": "n3", "impact": {"a": "1", "b": "2"}, "note": "first"})
    t2 = apply(t1, {"op": "update", "node": "n3", "value": 0.99, "impact": {"b": "3"}, "note": "second"})
    n = t2.nodes["n3"]
    assert n.action == tree.nodes["n3"].action.model_copy(update={"value": 0.99})
    assert n.beliefs.impact == {"a": "1", "b": "3"}
    assert n.beliefs.notes == ["first", "second"]
    assert n.beliefs.rating == tree.nodes["n3"].beliefs.rating


def test_update_by_ref_of_a_node_inserted_in_the_same_script(tree):
    new = apply(tree, ins(ROOT, "x", ref="x"), {"op": "update", "node": "x", "value": 0.01, "rating": 1})
    assert new.nodes["n9"].action.value == 0.01 and new.nodes["n9"].beliefs.rating == 1


def test_update_of_closed_and_root_nodes(tree):
    new = apply(tree, {"op": "update", "node": "n2", "rating": 2, "note": "slower than hoped", "value": 0.2})
    assert new.nodes["n2"].attachment == tree.nodes["n2"].attachment and new.nodes["n2"].kind == "closed"
    assert new.nodes["n2"].beliefs.notes[-1] == "slower than hoped"
    new = apply(tree, {"op": "update", "node": ROOT, "rating": 1, "note": "hard task"})
    assert new.nodes[ROOT].beliefs.rating == 1
    errors = rejected(tree, {"op": "update", "node": ROOT, "value": 0.3})
    assert errors == ["ops[0] (update): node 'root' (root) has no action to update"]
    errors = rejected(tree, {"op": "update", "node": "n42", "rating": 1})
    assert errors == ["ops[0] (update): node 'n42' does not exist"]


# ----------------------------------------------------------------------------- prune


def test_prune_open_leaf(tree):
    new = apply(tree, {"op": "prune", "node": "n3", "reason": "dominated"})
    assert "n3" not in new.nodes and "n3" in tree.nodes
    assert frontier_ids(new) == frontier_ids(tree) - {"n3"}
    new = apply(tree, {"op": "prune", "node": "n8"}, {"op": "prune", "node": "n6"})  # leaves first
    assert not {"n6", "n8"} & new.nodes.keys()


@pytest.mark.parametrize("node, pattern", [
    ("n6", r"'n6' has children \(later steps\); prune them first"),
    ("n2", r"only open nodes can be pruned; 'n2' is closed"),
    ("n5", r"only open nodes can be pruned; 'n5' is decision"),
    (ROOT, r"only open nodes can be pruned; 'root' is root"),
    ("nope", r"node 'nope' does not exist"),
])
def test_prune_only_open_leaves(tree, node, pattern):
    assert has_error(rejected(tree, {"op": "prune", "node": node}), pattern)


# ----------------------------------------------------------------------------- split


def test_split_turns_an_open_leaf_into_a_decision(tree):
    new = apply(tree, {"op": "split", "node": "n3", "into": [act("small1"), act("small2"), act("small3")]})
    assert new.nodes["n3"].kind == "decision" and new.nodes["n3"].action == tree.nodes["n3"].action
    kids = new.children("n3")
    assert [k.id for k in kids] == ["n9", "n10", "n11"] and {k.kind for k in kids} == {"open"}
    assert [k.action.title for k in kids] == ["small1", "small2", "small3"]
    assert frontier_ids(new) == (frontier_ids(tree) - {"n3"}) | {"n9", "n10", "n11"}


@pytest.mark.parametrize("node, pattern", [
    ("n2", r"only open nodes can be split; 'n2' is closed"),
    ("n5", r"only open nodes can be split; 'n5' is decision"),
    (ROOT, r"only open nodes can be split"),
    ("zz", r"node 'zz' does not exist"),
    # n6 has a later chain step (n8); as an alternative it would become selectable too early.
    ("n6", r"'n6' has children \(later steps\)"),
])
def test_split_rejections(tree, node, pattern):
    assert has_error(rejected(tree, {"op": "split", "node": node, "into": [act("p"), act("q")]}), pattern)


# ----------------------------------------------------------------------------- invariants


def test_at_most_max_new_nodes_per_script(tree):
    assert MAX_NEW_NODES == 3
    apply(tree, *[ins(ROOT, f"x{i}") for i in range(MAX_NEW_NODES)])
    errors = rejected(tree, *[ins(ROOT, f"x{i}") for i in range(MAX_NEW_NODES + 1)])
    assert errors == ["the script creates 4 nodes; at most 3 are allowed per update"]
    # split children count too
    errors = rejected(tree, {"op": "split", "node": "n3", "into": [act("p"), act("q"), act("r")]}, ins(ROOT, "x"))
    assert has_error(errors, r"creates 4 nodes; at most 3")
    # inserted-then-pruned nodes still count (the budget is on creations)
    errors = rejected(tree, *[ins(ROOT, f"x{i}", ref=f"r{i}") for i in range(3)], {"op": "prune", "node": "r0"},
                      ins(ROOT, "y"))
    assert has_error(errors, r"creates 4 nodes")


def test_init_allows_max_init_nodes():
    wm = WorldModel.new("t")
    ok = apply(wm, *[ins(ROOT, f"x{i}") for i in range(MAX_INIT_NODES)], max_new_nodes=MAX_INIT_NODES)
    assert len(ok.frontier()) == MAX_INIT_NODES
    errors = rejected(wm, *[ins(ROOT, f"x{i}") for i in range(MAX_INIT_NODES + 1)], max_new_nodes=MAX_INIT_NODES)
    assert errors == [f"the script creates {MAX_INIT_NODES + 1} nodes; at most {MAX_INIT_NODES} are allowed per update"]


def test_closed_node_keeps_an_open_descendant(tree):
    wm = close_node(tree, "n4", attachment("a2"))  # n4 has no children yet
    assert check_invariants(tree, wm) == ["closed node 'n4' needs at least one open child (a continuation of its success)"]
    errors = rejected(wm, {"op": "update", "node": "n4", "note": "done"})
    assert has_error(errors, r"closed node 'n4' needs at least one open child")
    assert check_invariants(wm, apply(wm, ins("n4", "next"))) == []
    # pruning the last alternatives under n2's decision is caught (here by the decision rule first)
    wm2 = apply(tree, {"op": "prune", "node": "n4"}, {"op": "prune", "node": "n8"}, {"op": "prune", "node": "n7"})
    errors = rejected(wm2, {"op": "prune", "node": "n6"})
    assert has_error(errors, r"decision node 'n5' has no alternatives")


def test_open_descendant_may_be_deep():
    wm = apply(WorldModel.new("t"), ins(ROOT, "s1", ref="s1"), ins("s1", "s2", ref="s2"), ins("s2", "s3"))
    wm = close_node(close_node(wm, "n1", attachment("a1")), "n2", attachment("a2"))
    assert check_invariants(wm, wm) == []  # n1 -> n2 (closed) -> n3 (open)


def test_reflection_required_when_reflect_on_given(tree):
    errors = rejected(tree, ins("n2", "x"), reflect_on="n2")
    assert errors == ["reflection is missing: write CURRENT, FOLLOW_THROUGH, UPDATE_BELIEF and PERF_GAP"]
    new = apply(tree, ins("n2", "x"), reflect_on="n2", reflection=REFLECTION)
    note = new.nodes["n2"].beliefs.notes[-1]
    assert note.splitlines() == [f"{k.upper()}: {v}" for k, v in REFLECTION.items()]
    # without reflect_on, a reflection is optional (and not written anywhere)
    new = apply(tree, ins("n2", "x"), reflection=REFLECTION)
    assert new.nodes["n2"].beliefs.notes == tree.nodes["n2"].beliefs.notes


def test_reflection_on_a_node_pruned_by_the_same_script_is_dropped(tree):
    new = apply(tree, {"op": "prune", "node": "n3"}, reflect_on="n3", reflection=REFLECTION)
    assert "n3" not in new.nodes


def test_decision_node_needs_children(tree):
    errors = rejected(tree, ins(ROOT, "fam", kind="decision"))
    assert errors == ["decision node 'n9' has no alternatives"]
    errors = rejected(tree, {"op": "prune", "node": "n8"}, {"op": "prune", "node": "n6"}, {"op": "prune", "node": "n7"})
    assert has_error(errors, r"decision node 'n5' has no alternatives")


def test_all_errors_are_reported_together(tree):
    errors = rejected(tree, ins("ghost", "x"), {"op": "prune", "node": "n2"}, {"op": "update", "node": "q", "rating": 1},
                      reflect_on="n2")
    assert len(errors) == 4
    assert errors[0].startswith("ops[0] (insert)") and errors[1].startswith("ops[1] (prune)")
    assert errors[2].startswith("ops[2] (update)") and errors[3].startswith("reflection is missing")


def test_analysis_is_kept():
    new = apply_edits(WorldModel.new("t"), script(ins(ROOT, "x"), analysis="memory bound decode"))
    assert new.analysis == "memory bound decode"
    again = apply_edits(new, script(ins(ROOT, "y")))
    assert again.analysis == "memory bound decode"  # an empty analysis does not erase it


# ----------------------------------------------------------------------------- check_invariants directly


def _broken(tree: WorldModel, mutate) -> list[str]:
    after = tree.model_copy(deep=True)
    mutate(after)
    return check_invariants(tree, after)


def test_check_invariants_root_intact(tree):
    assert _broken(tree, lambda t: t.nodes.pop(ROOT))[0] == "the root node must stay intact"
    assert "the root node must stay intact" in _broken(tree, lambda t: setattr(t.nodes[ROOT], "kind", "open"))
    assert "the root node must stay intact" in _broken(tree, lambda t: setattr(t.nodes[ROOT], "parent", "n1"))
    seeded = tree.model_copy(deep=True)
    seeded.nodes[ROOT].attachment = attachment("seed")
    assert "the root's attached seed solution cannot be changed" in check_invariants(seeded, tree)
    assert check_invariants(tree, seeded) == ["the root's attached seed solution cannot be changed"]


def test_check_invariants_attached_attempts(tree):
    def drop(t):
        del t.nodes["n2"]
        for n in list(t.nodes.values()):  # also drop its subtree so only the attempt rule fires
            if n.id in {"n4", "n5", "n6", "n7", "n8"}:
                del t.nodes[n.id]
    assert _broken(tree, drop) == ["node 'n2' carries attempt a1; it cannot be removed or changed"]
    assert _broken(tree, lambda t: setattr(t.nodes["n2"], "attachment", attachment("a9"))) == [
        "node 'n2' carries attempt a1; it cannot be removed or changed"]
    errs = _broken(tree, lambda t: setattr(t.nodes["n2"], "kind", "open"))
    assert "node 'n2' carries attempt a1; it cannot be removed or changed" in errs


def test_check_invariants_structure(tree):
    assert _broken(tree, lambda t: setattr(t.nodes["n3"], "parent", "n77")) == [
        "node 'n3' has a parent 'n77' that does not exist"]
    assert _broken(tree, lambda t: setattr(t.nodes["n3"], "parent", None)) == [
        "node 'n3' has a parent 'None' that does not exist"]
    assert _broken(tree, lambda t: setattr(t.nodes["n3"], "action", None)) == ["node 'n3' (open) needs an action"]


def _alarm(seconds: int):
    """Turn a hang into a failure; returns the previous SIGALRM handler to restore."""
    def handler(signum, frame):  # pragma: no cover - only on a hang
        raise TimeoutError("check_invariants did not terminate")
    previous = signal.signal(signal.SIGALRM, handler)
    signal.alarm(seconds)
    return previous


def test_check_invariants_reports_cycles_without_hanging(tree):
    # A hand-edited world model (``ksearch branch --world-model``) may contain a cycle.
    def cycle(t):
        t.nodes["n5"].parent = "n6"  # n5 -> n6 -> n5; closed n2 loses its path to them
        t.nodes["n4"].kind = "closed"
        t.nodes["n4"].parent = "n4"
    previous = _alarm(5)
    try:
        errors = _broken(tree, cycle)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert "the tree has a cycle" in errors


# ----------------------------------------------------------------------------- atomicity


def test_third_op_invalid_leaves_no_trace(tree):
    before = tree.model_dump()
    bad = [ins(ROOT, "x", ref="x"), {"op": "update", "node": "n1", "value": 0.01, "note": "n"},
           {"op": "prune", "node": "n2"}]
    with pytest.raises(EditRejected) as exc:
        apply(tree, *bad)
    assert exc.value.errors == ["ops[2] (prune): only open nodes can be pruned; 'n2' is closed"]
    assert tree.model_dump() == before
    assert tree.next_id == 9 and "n9" not in tree.nodes and tree.nodes["n1"].action.value == 0.5
    # ids are not burnt by the rejected attempt
    assert "n9" in apply(tree, ins(ROOT, "y")).nodes


# ----------------------------------------------------------------------------- parse_edit_script


GOOD_INSERT = ins(ROOT, "x")


@pytest.mark.parametrize("data, expected", [
    (None, [r"^\(script\): .*valid dictionary"]),
    ("{\"ops\": []}", [r"^\(script\): "]),
    (42, [r"^\(script\): "]),
    ([GOOD_INSERT], [r"^\(script\): "]),
    ({"ops": "insert"}, [r"^ops: .*valid list"]),
    ({"ops": [None]}, [r"^ops\.0: "]),
    ({"ops": [{"op": "delete", "node": "n1"}]}, [r"^ops\.0: .*'delete'.*(insert|update)"]),
    ({"ops": [{"node": "n1"}]}, [r"^ops\.0: .*discriminator 'op'"]),
    ({"ops": [{"op": "insert", "parent": ROOT}]}, [r"^ops\.0\.insert\.action: Field required"]),
    ({"ops": [{"op": "insert", "action": act()}]}, [r"^ops\.0\.insert\.parent: Field required"]),
    ({"ops": [{"op": "insert", "parent": 3, "action": act()}]}, [r"^ops\.0\.insert\.parent: .*valid string"]),
    ({"ops": [{"op": "insert", "parent": ROOT, "kind": "closed", "action": act()}]}, [r"^ops\.0\.insert\.kind: "]),
    ({"ops": [ins(ROOT, difficulty=0)]}, [r"^ops\.0\.insert\.action\.difficulty: .*greater than or equal to 1"]),
    ({"ops": [ins(ROOT, difficulty=6)]}, [r"^ops\.0\.insert\.action\.difficulty: .*less than or equal to 5"]),
    ({"ops": [ins(ROOT, difficulty="hard")]}, [r"^ops\.0\.insert\.action\.difficulty: .*valid integer"]),
    ({"ops": [ins(ROOT, difficulty=2.5)]}, [r"^ops\.0\.insert\.action\.difficulty: "]),
    ({"ops": [ins(ROOT, value=1.5)]}, [r"^ops\.0\.insert\.action\.value: .*less than or equal to 1"]),
    ({"ops": [ins(ROOT, value=-0.1)]}, [r"^ops\.0\.insert\.action\.value: .*greater than or equal to 0"]),
    ({"ops": [ins(ROOT, gain=0)]}, [r"^ops\.0\.insert\.action\.predicted_gain: .*greater than 0"]),
    ({"ops": [ins(ROOT, gain=101)]}, [r"^ops\.0\.insert\.action\.predicted_gain: .*less than or equal to 100"]),
    ({"ops": [ins(ROOT, "t" * 121)]}, [r"^ops\.0\.insert\.action\.title: .*at most 120"]),
    ({"ops": [ins(ROOT, "")]}, [r"^ops\.0\.insert\.action\.title: .*at least 1"]),
    ({"ops": [{**GOOD_INSERT, "rating": 11}]}, [r"^ops\.0\.insert\.rating: .*less than or equal to 10"]),
    ({"ops": [{**GOOD_INSERT, "confidence": -1}]}, [r"^ops\.0\.insert\.confidence: "]),
    ({"ops": [{"op": "update", "node": "n1", "value": 2}]}, [r"^ops\.0\.update\.value: .*less than or equal to 1"]),
    ({"ops": [{"op": "update", "node": "n1", "impact": "fast"}]}, [r"^ops\.0\.update\.impact: .*valid dictionary"]),
    ({"ops": [{"op": "update"}]}, [r"^ops\.0\.update\.node: Field required"]),
    ({"ops": [{"op": "prune"}]}, [r"^ops\.0\.prune\.node: Field required"]),
    ({"ops": [{"op": "split", "node": "n1", "into": [act()]}]}, [r"^ops\.0\.split\.into: .*at least 2"]),
    ({"ops": [{"op": "split", "node": "n1", "into": [act()] * 4}]}, [r"^ops\.0\.split\.into: .*at most 3"]),
    ({"ops": [{"op": "split", "node": "n1", "into": [act(), {"title": "x"}]}]},
     [r"^ops\.0\.split\.into\.1\.description: Field required"]),
    ({"ops": [GOOD_INSERT] * 21}, [r"^ops: .*at most 20"]),
    ({"reflection": {"current": "x"}}, [r"^reflection\.follow_through: Field required",
                                       r"^reflection\.update_belief: Field required",
                                       r"^reflection\.perf_gap: Field required"]),
    ({"reflection": {**REFLECTION, "current": ""}}, [r"^reflection\.current: .*at least 1"]),
    ({"reflection": "all good"}, [r"^reflection: "]),
    ({"analysis": "a" * 4001}, [r"^analysis: .*at most 4000"]),
    # extra garbage inside an op: a misspelt field must not be a silent no-op
    ({"ops": [{"op": "update", "node": "n1", "V": 0.2}]}, [r"^ops\.0\.update\.V: Extra inputs are not permitted"]),
    ({"ops": [{**GOOD_INSERT, "gain": 2}]}, [r"^ops\.0\.insert\.gain: Extra inputs are not permitted"]),
    ({"ops": [{"op": "prune", "node": "n1", "why": "x"}]}, [r"^ops\.0\.prune\.why: Extra inputs"]),
])
def test_parse_edit_script_rejects_malformed_input(data, expected):
    with pytest.raises(EditRejected) as exc:
        parse_edit_script(data)
    errors = exc.value.errors
    for pattern in expected:
        assert has_error(errors, pattern), (pattern, errors)
    assert all(": " in e for e in errors)  # "<field path>: <message>"


def test_parse_edit_script_reports_every_bad_field():
    data = {"reflection": {**REFLECTION, "perf_gap": ""},
            "ops": [ins(ROOT, difficulty=9, value=3), {"op": "update", "node": "n1", "rating": -1}, {"op": "nuke"}]}
    with pytest.raises(EditRejected) as exc:
        parse_edit_script(data)
    paths = {e.split(": ", 1)[0] for e in exc.value.errors}
    assert paths == {"reflection.perf_gap", "ops.0.insert.action.difficulty", "ops.0.insert.action.value",
                     "ops.1.update.rating", "ops.2"}


def test_parse_edit_script_accepts_valid_input_and_lenient_top_level():
    s = parse_edit_script({"analysis": "a", "reflection": REFLECTION, "thoughts": "ignored",
                           "ops": [GOOD_INSERT, {"op": "update", "node": "n1", "value": "0.5"},
                                   {"op": "prune", "node": "n2"}, {"op": "split", "node": "n3", "into": [act(), act()]}]})
    assert [op.op for op in s.ops] == ["insert", "update", "prune", "split"]
    assert s.ops[1].value == 0.5
    assert parse_edit_script({}) == EditScript()
    assert parse_edit_script(s.model_dump()) == s  # what the run caches round-trips


# ----------------------------------------------------------------------------- render


def _big_tree(n_chains: int = 12) -> WorldModel:
    wm = WorldModel.new("render me")
    for i in range(n_chains):
        wm = apply(wm, ins(ROOT, f"idea {i} " + "é" * i, ref="a", value=round(0.05 * i, 2)),
                   ins("a", f"idea {i} step 2", ref="b"), ins("b", f"idea {i} step 3"))
    wm = close_node(wm, "n1", attachment("a1", 2.0))
    wm = close_node(wm, "n2", attachment("a2", 3.0))
    wm = record_visit(wm, "n4", failed=True)
    wm = apply(wm, {"op": "update", "node": "n4", "note": "line one\nline two\u2028 \"quoted\""})
    return wm


def _check_render(wm: WorldModel, out: str, budget: int) -> list[dict]:
    """Every line is a JSON node, the root first; the whole frontier is shown; dropped nodes are counted; the
    budget holds unless the root and the bare frontier alone exceed it."""
    lines = out.split("\n")
    trailer = None
    if lines[-1].startswith("... "):
        trailer = lines.pop()
    objs = [json.loads(line) for line in lines]
    assert objs and objs[0]["id"] == ROOT
    ids = [o["id"] for o in objs]
    assert len(ids) == len(set(ids)) and set(ids) <= wm.nodes.keys()
    assert {n.id for n in wm.frontier()} <= set(ids)
    if trailer is None:
        assert set(ids) == wm.nodes.keys()
    else:
        m = re.fullmatch(r"\.\.\. (\d+) more nodes not shown \(lower priority\)", trailer)
        assert m and int(m.group(1)) == len(wm.nodes) - len(objs) > 0
    bare = [o for o in objs if o["kind"] == "open" and o["id"] != ROOT and "description" not in o
            and {n.id for n in wm.frontier()} >= {o["id"]}]
    must = len(lines[0]) + sum(len(json.dumps(o, separators=(",", ":"), ensure_ascii=False)) + 1 for o in bare)
    if len(objs) > 1 and must + 60 <= budget:
        assert len(out) <= budget, (len(out), budget)
    return objs


def test_render_respects_budget_and_emits_json_lines():
    wm = _big_tree()
    full = render(wm, budget_chars=10**6)
    assert "..." not in full.split("\n")[-1][:3]
    assert len(_check_render(wm, full, 10**6)) == len(wm.nodes)
    for budget in list(range(1, 400, 7)) + list(range(400, len(full) + 200, 97)):
        _check_render(wm, render(wm, budget_chars=budget), budget)
    exact = render(wm, budget_chars=len(full))
    assert exact == full  # exactly fitting needs no trailer


def test_render_tiny_budget_keeps_root_and_the_whole_frontier():
    wm = _big_tree(2)
    out = render(wm, budget_chars=1)
    objs = _check_render(wm, out, 1)
    frontier = sorted(wm.frontier(), key=lambda n: -n.action.value)
    assert [o["id"] for o in objs] == [ROOT] + [n.id for n in frontier]
    assert all(set(o) <= {"id", "parent", "kind", "title", "V", "difficulty", "gain", "rating", "visits", "failures"}
               for o in objs[1:])  # bare lines: title and numbers


def test_render_shows_every_frontier_action_of_a_large_tree():
    """A 30-node tree with 22 frontier actions and a closed chain of 7, in the default 6000
    characters. The old view showed 2 of the 22; the planner must re-score all of them."""
    wm = WorldModel.new("gqa")
    wm = apply(wm, ins(ROOT, "chain 0", ref="c0"))
    for i in range(1, 8):
        wm = apply(wm, ins(f"n{i}", f"chain {i}"))
    for i in range(1, 8):
        wm = close_node(wm, f"n{i}", attachment(f"c{i}.1", 1.0 + i / 10))
        wm = apply(wm, {"op": "update", "node": f"n{i}", "note": "CURRENT: " + "x" * 600})
    while len(wm.frontier()) < 22:
        parent = f"n{1 + len(wm.frontier()) % 7}"
        wm = apply(wm, ins(parent, f"idea {len(wm.nodes)}", value=0.3, description="d" * 250))
    assert len(wm.frontier()) == 22 and len(wm.nodes) == 30
    out = render(wm, budget_chars=6000, focus="n7")
    objs = _check_render(wm, out, 6000)
    assert {n.id for n in wm.frontier()} <= {o["id"] for o in objs}
    assert any(o["kind"] == "closed" for o in objs)  # room is left for context
    assert len(out) <= 6000


def test_render_priorities_and_a_stable_order():
    """Which nodes make it into a short view: the focus node's path first. In which order they go out: the root,
    then by id (creation order), so that consecutive views share a long prefix: a new node comes last."""
    wm = _big_tree()
    focus = "n6"  # root -> n1 (closed) -> n2 (closed) -> n3 (open) ... n6 is chain idea 1 step 3
    path = [n.id for n in wm.path(focus)]
    full = render(wm, budget_chars=10**6)
    budget = len(full) // 2
    objs = _check_render(wm, render(wm, budget_chars=budget, focus=focus), budget)
    ids = [o["id"] for o in objs]
    assert set(path) <= set(ids)
    assert ids[0] == "root" and ids[1:] == sorted(ids[1:], key=lambda i: int(i[1:]))
    grown = apply(wm, ins("n1", "a new idea"))
    assert render(grown, budget_chars=10**6).startswith(full)  # a new node is appended to the view
    assert render(wm, budget_chars=500, focus="not-a-node").split("\n")[0] == render(wm, budget_chars=500).split("\n")[0]


def test_render_compact_fields():
    wm = _big_tree(3)
    wm = apply(wm, {"op": "update", "node": "n3", "description": "d" * 1000, "note": "z" * 1000})
    objs = {o["id"]: o for o in _check_render(wm, render(wm, budget_chars=10**6), 10**6)}
    assert objs["n3"]["description"] == "d" * 300 and objs["n3"]["last_note"] == "z" * 400
    assert objs["n1"]["attempt"] == "a1" and objs["n1"]["score"] == 2.0 and "description" not in objs["n1"]
    assert objs["n4"]["visits"] == 1 and objs["n4"]["failures"] == 1
    assert objs["n4"]["last_note"].startswith("line one\nline two")
    assert objs[ROOT]["last_note"] == "task: render me" and "V" not in objs[ROOT]
    assert {"title", "V", "difficulty", "gain", "rating"} <= objs["n3"].keys()


# ----------------------------------------------------------------------------- bookkeeping


def test_close_node(tree):
    new = close_node(tree, "n6", attachment("a7", 4.0))
    assert tree.nodes["n6"].kind == "open" and tree.nodes["n6"].attachment is None
    assert new.nodes["n6"].kind == "closed" and new.nodes["n6"].attachment == attachment("a7", 4.0)
    assert "n8" in frontier_ids(new) and "n6" not in frontier_ids(new)
    assert check_invariants(tree, new) == []  # n8 is its continuation


def test_record_visit(tree):
    new = record_visit(tree, "n1", failed=True)
    new = record_visit(new, "n1", failed=False)
    assert (new.nodes["n1"].visits, new.nodes["n1"].failures) == (2, 1)
    assert (tree.nodes["n1"].visits, tree.nodes["n1"].failures) == (0, 0)
    assert record_visit(tree, "gone", failed=True) == tree  # a pruned node: no-op


def test_ensure_continuation(tree):
    assert ensure_continuation(tree, "n2") is tree  # n2 already has open descendants
    closed = close_node(tree, "n4", attachment("a2"))
    fixed = ensure_continuation(closed, "n4")
    assert check_invariants(closed, fixed) == []
    kid = fixed.nodes["n9"]
    assert (kid.parent, kid.kind) == ("n4", "open") and kid.action.title == "Refine: B2"
    assert fixed.next_id == closed.next_id + 1 and "n9" not in closed.nodes
    long = apply(tree, {"op": "update", "node": "n3", "title": "t" * 120})
    long = ensure_continuation(close_node(long, "n3", attachment("a3")), "n3")
    assert len(long.nodes["n9"].action.title) == 120
    seeded = WorldModel.new("t")
    assert ensure_continuation(seeded, ROOT).nodes["n1"].action.title == "Refine: the current best"


def test_close_then_update_round(tree):
    """The graph's update step: close, then the planner's edits must add a continuation."""
    wm = close_node(record_visit(tree, "n3", failed=False), "n3", attachment("a3"))
    errors = rejected(wm, {"op": "update", "node": "n1", "value": 0.2}, reflect_on="n3", reflection=REFLECTION)
    assert errors == ["closed node 'n3' needs at least one open child (a continuation of its success)"]
    ok = apply(wm, ins("n3", "next"), reflect_on="n3", reflection=REFLECTION)
    assert "n9" in frontier_ids(ok) and ok.nodes["n3"].beliefs.notes[-1].startswith("CURRENT: ")


# ----------------------------------------------------------------------------- fuzz


_IDS = [ROOT] + [f"n{i}" for i in range(1, 60)] + ["ghost", "", "N1", "n01"]
_REFS = ["a", "b", "c", "x", ROOT, "n1", "n3"]
_GARBAGE = [None, "", "x", [], {}, -1, 0, 1e9, True, 3.5, "0.5", [1, 2], {"k": "v"}]


def _rand_action(rng: random.Random) -> dict:
    a = {"title": rng.choice(["tile", "split-K", "vectorize", "t" * 120]), "description": "desc",
         "difficulty": rng.randint(1, 5), "value": round(rng.random(), 3),
         "predicted_gain": rng.choice([0.5, 1.0, 1.3, 2.0, 100])}
    if rng.random() < 0.3:
        a["rationale"] = "because"
    if rng.random() < 0.1:
        a["params"] = {"BLOCK": rng.choice([32, 64])}
    return a


def _maybe_break(rng: random.Random, d: dict, p: float) -> dict:
    """With probability p, corrupt one field (garbage value, out-of-range number, dropped or extra key)."""
    if rng.random() >= p or not d:
        return d
    d = dict(d)
    key = rng.choice(sorted(d))
    r = rng.random()
    if r < 0.4:
        d[key] = rng.choice(_GARBAGE)
    elif r < 0.6:
        d.pop(key)
    elif r < 0.8:
        d[key] = rng.choice([-5, 11, 101, 1.0001, -0.0001, 6, 0])
    else:
        d[rng.choice(["V", "gain", "junk", "kind2"])] = rng.choice(_GARBAGE)
    return d


def _rand_node(rng: random.Random, wm: WorldModel, refs: list[str]) -> str:
    r = rng.random()
    if r < 0.7:
        return rng.choice(sorted(wm.nodes))
    if r < 0.85 and refs:
        return rng.choice(refs)
    return rng.choice(_IDS)


def _rand_op(rng: random.Random, wm: WorldModel, refs: list[str], p_break: float) -> dict:
    kind = rng.choices(["insert", "update", "prune", "split"], weights=[4, 3, 2, 1])[0]
    if kind == "insert":
        op = {"op": "insert", "parent": _rand_node(rng, wm, refs), "action": _maybe_break(rng, _rand_action(rng), p_break)}
        if rng.random() < 0.5:
            op["ref"] = rng.choice(_REFS)
            refs.append(op["ref"])
        if rng.random() < 0.15:
            op["kind"] = "decision"
        if rng.random() < 0.3:
            op["rating"], op["confidence"] = round(rng.uniform(0, 10), 2), round(rng.random(), 2)
    elif kind == "update":
        op = {"op": "update", "node": _rand_node(rng, wm, refs)}
        fields = {"value": round(rng.random(), 2), "difficulty": rng.randint(1, 5), "predicted_gain": 1.1,
                  "title": "renamed", "description": "redescribed", "rationale": "r", "rating": rng.randint(0, 10),
                  "confidence": 0.3, "impact": {"memory_bandwidth": "high"}, "note": "noted"}
        for k in rng.sample(sorted(fields), rng.randint(0, 4)):
            op[k] = fields[k]
    elif kind == "prune":
        op = {"op": "prune", "node": _rand_node(rng, wm, refs), "reason": "dominated"}
    else:
        op = {"op": "split", "node": _rand_node(rng, wm, refs),
              "into": [_rand_action(rng) for _ in range(rng.choice([2, 2, 3, 3, 1, 4]))]}
    if rng.random() < 0.03:
        op["op"] = rng.choice(["delete", "move", None, 5])
    return _maybe_break(rng, op, p_break)


def _rand_script(rng: random.Random, wm: WorldModel) -> dict:
    p_break = rng.choice([0.0, 0.0, 0.05, 0.3])
    refs: list[str] = []
    data: dict = {"ops": [_rand_op(rng, wm, refs, p_break) for _ in range(rng.choice([0, 1, 1, 2, 2, 3, 3, 4, 5]))]}
    if rng.random() < 0.6:
        data["reflection"] = _maybe_break(rng, dict(REFLECTION), p_break)
    if rng.random() < 0.1:
        data["analysis"] = "fuzzed analysis"
    if rng.random() < 0.02:
        return rng.choice([None, "ops", [data], {"ops": {"0": data["ops"]}}])
    return data


def _oracle_problems(before: WorldModel, after: WorldModel) -> list[str]:
    """An independent restatement of the invariants (so a weak check_invariants cannot hide a bug)."""
    problems = []
    root = after.nodes.get(ROOT)
    if root is None or root.kind != "root" or root.parent is not None or root.attachment != before.nodes[ROOT].attachment:
        problems.append("root")
    kids: dict[str, list[Node]] = {}
    for node in after.nodes.values():
        kids.setdefault(node.parent, []).append(node)
    for nid, node in after.nodes.items():
        if node.id != nid:
            problems.append(f"{nid}: id mismatch")
        if nid != ROOT and node.parent not in after.nodes:
            problems.append(f"{nid}: dangling parent")
        if node.kind == "root" and nid != ROOT:
            problems.append(f"{nid}: second root")
        if node.kind in ("open", "decision") and node.action is None:
            problems.append(f"{nid}: no action")
        if node.kind == "decision" and not kids.get(nid):
            problems.append(f"{nid}: empty decision")
        if node.kind == "closed":
            stack, found = list(kids.get(nid, [])), False
            while stack and not found:
                child = stack.pop()
                found = child.kind == "open"
                stack += kids.get(child.id, [])
            if not found:
                problems.append(f"{nid}: no continuation")
    # reachable from the root (no cycles, no orphans)
    seen, stack = set(), [ROOT]
    while stack:
        cur = stack.pop()
        if cur not in seen:
            seen.add(cur)
            stack += [c.id for c in kids.get(cur, [])]
    if seen != after.nodes.keys():
        problems.append("unreachable nodes")
    for nid, node in before.nodes.items():
        if node.attachment is not None:
            kept = after.nodes.get(nid)
            if kept is None or kept.attachment != node.attachment or kept.kind != node.kind:
                problems.append(f"{nid}: attempt lost")
    return problems


def _grow(rng: random.Random, wm: WorldModel, step: int) -> WorldModel:
    """Bookkeeping the graph does between updates: visits, closing a frontier node (plus its continuation)."""
    r = rng.random()
    if r < 0.2 and wm.frontier():
        nid = rng.choice(sorted(n.id for n in wm.frontier()))
        wm = record_visit(wm, nid, failed=False)
        closed = close_node(wm, nid, attachment(f"att{step}", round(rng.uniform(0.1, 5), 2)))
        wm2 = ensure_continuation(closed, nid)
        assert check_invariants(wm, wm2) == []
        return wm2
    if r < 0.3 and wm.frontier():
        return record_visit(wm, rng.choice(sorted(n.id for n in wm.frontier())), failed=True)
    return wm


@pytest.mark.parametrize("seed", range(4))
def test_fuzz_edit_scripts(seed):
    rng = random.Random(seed)
    wm = WorldModel.new("fuzz")
    if rng.random() < 0.5:
        wm.nodes[ROOT].attachment = attachment("seed")
    stats = {"parse_rejected": 0, "apply_rejected": 0, "accepted": 0}
    for step in range(750):
        if len(wm.nodes) > 30:
            wm = WorldModel.new("fuzz")
        wm = _grow(rng, wm, step)
        data = _rand_script(rng, wm)
        context = f"seed={seed} step={step} script={data!r}"
        before_dump = wm.model_dump()
        try:
            parsed = parse_edit_script(copy.deepcopy(data))
        except EditRejected as e:
            assert e.errors and all(isinstance(x, str) and ": " in x for x in e.errors), context
            stats["parse_rejected"] += 1
            continue
        reflect_on = rng.choice([None, None, _rand_node(rng, wm, [])])
        max_new = rng.choice([MAX_NEW_NODES, MAX_NEW_NODES, MAX_INIT_NODES])
        try:
            new = apply_edits(wm, parsed, reflect_on=reflect_on, max_new_nodes=max_new)
        except EditRejected as e:
            assert e.errors and all(isinstance(x, str) and x for x in e.errors), context
            assert wm.model_dump() == before_dump, context
            stats["apply_rejected"] += 1
            continue
        stats["accepted"] += 1
        assert wm.model_dump() == before_dump, f"input mutated: {context}"
        assert check_invariants(wm, new) == [], context
        assert _oracle_problems(wm, new) == [], context
        # round-trips through graph state
        state = new.to_state()
        assert json.loads(json.dumps(state)) == state, context
        assert WorldModel.from_state(state) == new and WorldModel.from_state(state).to_state() == state, context
        # creation budget and ids
        created = new.nodes.keys() - wm.nodes.keys()
        assert len(created) <= max_new, context
        assert all(int(c[1:]) >= wm.next_id for c in created) and new.next_id >= wm.next_id, context
        # chains: an open node that was waiting for its parent does not become selectable by an edit
        waiting = {n.id for n in wm.nodes.values() if n.kind == "open"} - frontier_ids(wm)
        assert not (waiting & frontier_ids(new)), context
        # the reflection lands on the node the cycle worked on
        if reflect_on is not None and reflect_on in new.nodes:
            assert new.nodes[reflect_on].beliefs.notes[-1].startswith("CURRENT: "), context
        # views stay usable
        budget = rng.choice([50, 400, 2000])
        _check_render(new, render(new, budget_chars=budget, focus=rng.choice(sorted(new.nodes))), budget)
        picks = select_actions(new, 3, policy=rng.choice(["greedy", "failure_aware"]))
        assert len(set(picks)) == len(picks) and set(picks) <= frontier_ids(new), context
        wm = new
    # every branch got real exercise
    assert all(v >= 75 for v in stats.values()), stats
