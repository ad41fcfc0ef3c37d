"""Reading a run back: its checkpoints (the points it can be branched from), its state at one of them, the summary
`ksearch show` prints, the world model as text. Readers only: nothing here writes into the run directory."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterator

from ksearch_graph.rundir.run_dir import RunDir, RunDirError
from ksearch_graph.search.graph import build_search_graph
from ksearch_graph.search.rolling import merge_points
from ksearch_graph.search.world_model import WorldModel
from ksearch_graph.tasks.speed_of_light import row_fractions, run_work


def history(run: RunDir) -> list[dict]:
    """Main-graph checkpoints, oldest first: the points a run can be branched from."""
    graph = build_search_graph(run.checkpointer())
    rows = []
    for snap in graph.get_state_history(run.graph_config()):
        values = snap.values or {}
        best = values.get("best") or {}
        rows.append({
            "checkpoint": snap.config["configurable"]["checkpoint_id"],
            "step": snap.metadata.get("step"),
            "node": values.get("last_node") or "(input)",
            "next": list(snap.next),
            "iteration": values.get("iterations_done", 0),
            "best_score": best.get("score"),
            "best_attempt": best.get("attempt_id"),
            "created": snap.created_at,
        })
    return rows[::-1] + _rolling_merge_rows(run)


def _rolling_merge_rows(run: RunDir) -> list[dict]:
    """Rolling cycles (k > 1) merge inside a round, between main-graph checkpoints: each merge is a branch point too,
    named ``merge:<cycle id>`` (``ksearch branch DIR --at merge:c7``)."""
    store = run.store()
    try:
        points = merge_points(store)
    finally:
        store.close()
    return [{"checkpoint": p["id"], "step": None, "node": "next_cycle", "next": ["select_plans"],
             "iteration": p["state"]["iterations_done"], "best_score": (p["state"]["best"] or {}).get("score"),
             "best_attempt": (p["state"]["best"] or {}).get("attempt_id"),
             "created": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(p["created"]))} for p in points]


def state_at(run: RunDir, checkpoint_id: str | None = None) -> dict:
    graph = build_search_graph(run.checkpointer())
    snap = graph.get_state(run.graph_config(checkpoint_id))
    if checkpoint_id and not snap.values:
        raise RunDirError(f"{run.path} has no checkpoint {checkpoint_id} (see `ksearch history {run.path}`)")
    return dict(snap.values or {})


def summary(run: RunDir) -> dict:
    """What `ksearch show --json` prints."""
    values = state_at(run)
    store = run.store()
    try:
        best = values.get("best")
        wm = WorldModel.from_state(values["world_model"]) if values.get("world_model") else None
        attempts = store.attempts()
        work = functools.cache(lambda: run_work(store, run.task(), save=False))
        return {
            "run_dir": str(run.path),
            "task": run.task().name,
            "status": store.get_meta("status", "new"),
            "planner": run.config.planner,
            "iterations_done": store.count_attempts(),
            "iteration_budget": run.config.budget.iterations,
            "attempts": len([a for a in attempts if a["prompt_kind"] != "seed"]),
            "passed": len([a for a in attempts if a["status"] == "passed" and a["prompt_kind"] != "seed"]),
            "best": None if not best else {k: best[k] for k in ("attempt_id", "score", "latency_us", "node_id")} | {
                "speed_of_light": _as_dict(row_fractions(store.get_attempt(best["attempt_id"]), work))},
            "tokens": store.token_totals(),
            "stop_reason": values.get("stop_reason"),
            "frontier": [] if wm is None else [
                {"id": n.id, "title": n.action.title, "value": n.action.value, "difficulty": n.action.difficulty}
                for n in wm.frontier()
            ],
            "world_model_nodes": 0 if wm is None else len(wm.nodes),
            "branched_from": run.branched_from,
            "gpu_models": store.get_meta("gpu_models") or [],  # [{"model", "from_iteration"}], see gpu_record.py
        }
    finally:
        store.close()


def _as_dict(fractions) -> dict | None:
    return fractions.as_dict() if fractions is not None else None


def iter_tree_lines(wm: WorldModel) -> Iterator[str]:
    """The tree as indented text lines for `ksearch show`."""
    def walk(nid: str, depth: int):
        node = wm.nodes[nid]
        mark = {"root": "*", "closed": "+", "open": "o", "decision": "?"}[node.kind]
        title = node.action.title if node.action else "(task)"
        extra = []
        if node.action and node.kind == "open":
            extra.append(f"V={node.action.value:.2f} d={node.action.difficulty}")
        if node.attachment:
            extra.append(f"{node.attachment.attempt_id} score={node.attachment.score:.4g}")
        if node.visits:
            extra.append(f"visits={node.visits} failed={node.failures}")
        yield f"{'  ' * depth}{mark} {nid} {title}" + (f"  [{', '.join(extra)}]" if extra else "")
        for child in wm.children(nid):
            yield from walk(child.id, depth + 1)

    yield from walk("root", 0)


def dumps(obj) -> str:
    return json.dumps(obj, indent=2, default=str)
