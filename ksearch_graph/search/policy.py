"""Which frontier action to implement next.

``greedy`` is the paper's deterministic rule, kept as the default for fidelity: drop actions above
the difficulty cap (unless that drops all), then sort by V desc, difficulty asc, rating desc, id.

``failure_aware`` fixes the rule's blind spot (docs/method.md, "Where we depart"): an action the planner forgot
to down-score after a failed cycle is otherwise chosen again and again. It discounts V by the node's
failed cycles and adds a small UCB-style bonus for rarely visited nodes, so untried ideas get a turn.
"""

from __future__ import annotations

import math

from ksearch_graph.config import PolicyName
from ksearch_graph.search.world_model import Node, WorldModel

# The reference's refill rule: a frontier whose best action's V is not above this is weak, and the planner is asked
# for new actions before the next cycle starts (nodes/select_plans.py).
WEAK_VALUE = 0.5


def weak_frontier(wm: WorldModel) -> bool:
    """No open action valued above WEAK_VALUE, or none at all."""
    return not any(n.action.value > WEAK_VALUE for n in wm.frontier())


def _node_number(node: Node) -> tuple[int, str]:
    # n2 before n10; ids are "n<k>" but sort robustly if not.
    digits = node.id[1:]
    return (int(digits), "") if digits.isdigit() else (1 << 30, node.id)


def _within_cap(frontier: list[Node], difficulty_cap: int) -> list[Node]:
    capped = [n for n in frontier if n.action.difficulty <= difficulty_cap]
    return capped or frontier


def greedy_order(frontier: list[Node], difficulty_cap: int) -> list[Node]:
    return sorted(
        _within_cap(frontier, difficulty_cap),
        key=lambda n: (-n.action.value, n.action.difficulty, -n.beliefs.rating, _node_number(n)),
    )


def failure_aware_order(
    frontier: list[Node],
    difficulty_cap: int,
    *,
    failure_discount: float = 0.5,
    exploration: float = 0.1,
) -> list[Node]:
    total_visits = sum(n.visits for n in frontier)

    def adjusted(n: Node) -> float:
        discounted = n.action.value * failure_discount**n.failures
        bonus = exploration * math.sqrt(math.log(1 + total_visits) / (1 + n.visits))
        return discounted + bonus

    return sorted(
        _within_cap(frontier, difficulty_cap),
        key=lambda n: (-adjusted(n), n.action.difficulty, -n.beliefs.rating, _node_number(n)),
    )


def select_actions(
    wm: WorldModel,
    k: int,
    *,
    policy: PolicyName = "greedy",
    difficulty_cap: int = 4,
    exclude: set[str] = frozenset(),
) -> list[str]:
    """Up to ``k`` distinct frontier node ids, best first. Empty when the frontier is exhausted."""
    frontier = [n for n in wm.frontier() if n.id not in exclude]
    if policy == "greedy":
        ordered = greedy_order(frontier, difficulty_cap)
    elif policy == "failure_aware":
        ordered = failure_aware_order(frontier, difficulty_cap)
    else:
        raise ValueError(f"unknown selection policy {policy!r}")
    return [n.id for n in ordered[:k]]
