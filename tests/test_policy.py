"""Action selection: the paper's greedy rule (exactly) and the failure-aware variant."""

from __future__ import annotations

import random

import pytest

from ksearch_graph.search.policy import failure_aware_order, greedy_order, select_actions
from ksearch_graph.search.world_model import ROOT, Action, Attachment, Beliefs, Node, WorldModel, record_visit


def node(nid: str, value: float, difficulty: int = 2, rating: float = 5.0, *, parent: str = ROOT,
         kind: str = "open", visits: int = 0, failures: int = 0) -> Node:
    return Node(
        id=nid, parent=parent, kind=kind,
        action=Action(title=nid, description=f"do {nid}", difficulty=difficulty, value=value, predicted_gain=1.2),
        beliefs=Beliefs(rating=rating), visits=visits, failures=failures,
        attachment=Attachment(attempt_id=f"a-{nid}", source_hash="h", status="passed", score=1.0)
        if kind == "closed" else None,
    )


def tree(*nodes: Node) -> WorldModel:
    wm = WorldModel.new("t")
    for n in nodes:
        wm.nodes[n.id] = n
    return wm


def greedy(wm: WorldModel, k: int = 10, **kw) -> list[str]:
    return select_actions(wm, k, **kw)


# ----------------------------------------------------------------------------- greedy (the paper's rule)


def test_value_descending_first():
    wm = tree(node("n1", 0.2, rating=10), node("n2", 0.9, difficulty=4, rating=0), node("n3", 0.5))
    assert greedy(wm) == ["n2", "n3", "n1"]


def test_ties_on_value_broken_by_difficulty_ascending():
    wm = tree(node("n1", 0.5, difficulty=3, rating=9), node("n2", 0.5, difficulty=1, rating=1), node("n3", 0.5, 2))
    assert greedy(wm) == ["n2", "n3", "n1"]


def test_ties_on_value_and_difficulty_broken_by_rating_descending():
    wm = tree(node("n1", 0.5, 2, rating=3), node("n2", 0.5, 2, rating=8.5), node("n3", 0.5, 2, rating=5))
    assert greedy(wm) == ["n2", "n3", "n1"]


def test_full_ties_broken_by_numeric_node_id():
    wm = tree(*[node(f"n{i}", 0.5) for i in (10, 2, 1, 33, 3)])
    assert greedy(wm) == ["n1", "n2", "n3", "n10", "n33"]  # n2 before n10, unlike string order


def test_difficulty_cap_drops_hard_actions():
    wm = tree(node("n1", 0.99, difficulty=5), node("n2", 0.1, difficulty=4), node("n3", 0.2, difficulty=1))
    assert greedy(wm) == ["n3", "n2"]  # default cap 4: difficulty == cap is kept
    assert greedy(wm, difficulty_cap=5) == ["n1", "n3", "n2"]
    assert greedy(wm, difficulty_cap=3) == ["n3"]


def test_difficulty_cap_falls_back_to_all_when_nothing_remains():
    wm = tree(node("n1", 0.3, difficulty=5), node("n2", 0.3, difficulty=4), node("n3", 0.9, difficulty=5))
    assert greedy(wm, difficulty_cap=3) == ["n3", "n2", "n1"]  # ordinary order over everything
    assert greedy(wm, difficulty_cap=4) == ["n2"]


def test_only_frontier_nodes_are_candidates():
    wm = tree(
        node("n1", 0.1, kind="closed"), node("n2", 0.2, parent="n1"),  # n2: child of closed -> frontier
        node("n3", 0.9, parent="n2"),  # step 2 of a chain whose step 1 (n2) is open -> waits
        node("n4", 0.5, kind="decision"), node("n5", 0.4, parent="n4"), node("n6", 0.3, parent="n4"),
    )
    assert greedy(wm) == ["n5", "n6", "n2"]
    assert select_actions(WorldModel.new("t"), 3) == []


def test_matches_a_reference_implementation_on_random_frontiers():
    rng = random.Random(0)
    for _ in range(300):
        nodes = [node(f"n{i}", rng.choice([0.1, 0.5, 0.5, 0.9]), rng.randint(1, 5), rng.choice([2.0, 5.0, 7.5]))
                 for i in rng.sample(range(1, 40), rng.randint(1, 8))]
        cap = rng.randint(1, 5)
        capped = [n for n in nodes if n.action.difficulty <= cap] or nodes
        expected = [n.id for n in sorted(capped, key=lambda n: (-n.action.value, n.action.difficulty,
                                                                 -n.beliefs.rating, int(n.id[1:])))]
        shuffled = nodes[:]
        rng.shuffle(shuffled)
        assert [n.id for n in greedy_order(shuffled, cap)] == expected
        assert select_actions(tree(*shuffled), 3, difficulty_cap=cap) == expected[:3]


# ----------------------------------------------------------------------------- k and exclude


def test_k_returns_distinct_best_first():
    wm = tree(*[node(f"n{i}", v) for i, v in enumerate([0.1, 0.9, 0.5, 0.7, 0.3], start=1)])
    assert select_actions(wm, 1) == ["n2"]
    assert select_actions(wm, 3) == ["n2", "n4", "n3"]
    picks = select_actions(wm, 50)
    assert len(picks) == len(set(picks)) == 5
    assert select_actions(wm, 0) == []
    for policy in ("greedy", "failure_aware"):
        picks = select_actions(wm, 4, policy=policy)
        assert len(picks) == len(set(picks)) == 4


def test_exclude():
    wm = tree(node("n1", 0.9), node("n2", 0.8), node("n3", 0.7, difficulty=5))
    assert select_actions(wm, 2, exclude={"n1"}) == ["n2"]  # n3 is above the cap
    assert select_actions(wm, 2, exclude={"n1", "n2"}) == ["n3"]  # ... unless nothing else is left
    assert select_actions(wm, 2, exclude={"n1", "n2", "n3"}) == []
    assert select_actions(wm, 2, exclude={"ghost"}) == ["n1", "n2"]
    assert select_actions(wm, 2, policy="failure_aware", exclude={"n1"}) == ["n2"]


# ----------------------------------------------------------------------------- failure-aware


def test_failure_aware_prefers_a_fresh_node_over_an_equal_value_failed_one():
    wm = tree(node("n1", 0.6, visits=1, failures=1), node("n2", 0.6))
    assert select_actions(wm, 1) == ["n1"]  # greedy has no memory: the id decides
    assert select_actions(wm, 1, policy="failure_aware") == ["n2"]
    assert select_actions(wm, 2, policy="failure_aware") == ["n2", "n1"]


def test_failed_node_is_chosen_less_over_repeated_rounds():
    """An action the planner forgot to down-score: greedy retries it forever, failure-aware rotates."""
    start = tree(node("n1", 0.7), node("n2", 0.7), node("n3", 0.65))
    counts = {}
    for policy in ("greedy", "failure_aware"):
        wm, picks = start, []
        for _ in range(12):
            (nid,) = select_actions(wm, 1, policy=policy)
            picks.append(nid)
            wm = record_visit(wm, nid, failed=True)
        counts[policy] = {n: picks.count(n) for n in ("n1", "n2", "n3")}
    assert counts["greedy"] == {"n1": 12, "n2": 0, "n3": 0}
    assert all(c >= 2 for c in counts["failure_aware"].values()), counts
    assert max(counts["failure_aware"].values()) <= 6, counts


def test_unvisited_node_gets_an_exploration_bonus():
    # n1 was tried and did not fail (e.g. partial progress): no discount, but its bonus is smaller.
    wm = tree(node("n1", 0.52, visits=2), node("n2", 0.5))
    assert select_actions(wm, 1) == ["n1"]
    assert select_actions(wm, 1, policy="failure_aware") == ["n2"]
    # the bonus is small: a clearly better visited action still wins
    wm = tree(node("n1", 0.9, visits=2), node("n2", 0.5))
    assert select_actions(wm, 1, policy="failure_aware") == ["n1"]


def test_failure_aware_equals_greedy_without_history():
    rng = random.Random(1)
    for _ in range(100):
        nodes = [node(f"n{i}", rng.choice([0.2, 0.5, 0.8]), rng.randint(1, 5), rng.choice([3.0, 6.0]))
                 for i in rng.sample(range(1, 30), rng.randint(1, 6))]
        cap = rng.randint(1, 5)
        assert [n.id for n in failure_aware_order(nodes, cap)] == [n.id for n in greedy_order(nodes, cap)]


def test_failure_aware_respects_the_difficulty_cap():
    wm = tree(node("n1", 0.9, difficulty=5), node("n2", 0.1, visits=3, failures=3))
    assert select_actions(wm, 2, policy="failure_aware") == ["n2"]
    assert select_actions(wm, 2, policy="failure_aware", difficulty_cap=5) == ["n1", "n2"]


def test_unknown_policy_raises():
    wm = tree(node("n1", 0.5))
    with pytest.raises(ValueError, match="unknown selection policy 'ucb'"):
        select_actions(wm, 1, policy="ucb")  # type: ignore[arg-type]
