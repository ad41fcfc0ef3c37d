"""``ksearch recover DIR``: rebuild a resumable run from store.sqlite when its checkpoints (or run.json) are lost.

The store records every evaluated attempt, the world model after every update, the token ledger, and a copy
of run.json. The rebuilt state is the last recorded world model with the cycles it merged; cycles the store
has attempts of beyond that are handed to the next world-model update as finished (an in-flight cycle closes
at its last evaluated attempt), exactly as the graph does after ``action_cycle``. So no evaluated attempt is
lost or evaluated again. Damaged files are moved into ``DIR/damaged-<time>/``, never deleted.

A missing, empty or damaged store cannot be rebuilt from (it alone holds the attempts' code): recover stops and
says so; ``--start-over`` keeps run.json and the task and sets every database aside, so the search starts again.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from ksearch_graph.rundir.integrity import DamagedRun, check_for_writing, set_aside, store_lost, store_problem
from ksearch_graph.rundir.run_dir import RUN_FILE, RunDir, RunDirError, write_atomically
from ksearch_graph.rundir.run_lock import RunLock
from ksearch_graph.rundir.store import RunStore, attempt_summary
from ksearch_graph.search.graph import build_search_graph
from ksearch_graph.search.merge import best_entry
from ksearch_graph.search.world_model import ROOT

_MERGED_BY = re.compile(r"update after (\S+)$")


@dataclass
class Recovery:
    run: RunDir
    kept_aside: list[str] = field(default_factory=list)
    restored_manifest: bool = False
    sound: bool = False  # the checkpoints needed nothing
    rebuilt: bool = False  # a checkpoint was seeded from the store
    started_over: bool = False  # the store was lost: the search starts again (--start-over)
    attempts: int = 0
    merged_cycles: list[str] = field(default_factory=list)
    closed_cycles: list[str] = field(default_factory=list)  # handed to the next update as finished
    world_model_from: str = ""


def recover(path: str | Path, *, start_over: bool = False) -> Recovery:
    path = Path(path)
    store_path = path / "store.sqlite"
    if not (path / RUN_FILE).is_file() and not store_path.is_file():
        raise RunDirError(f"{path} is not a run directory (no {RUN_FILE}, no store.sqlite)")
    lock = RunLock(path).acquire()
    problem = store_problem(store_path)
    checkpoints = path / "checkpoints.sqlite"
    nothing_to_lose = problem in ("is missing", "is empty") and not (checkpoints.exists() and checkpoints.stat().st_size)
    if problem and not nothing_to_lose:
        if not start_over:
            lock.release()
            raise store_lost(path, problem)
        return _start_over(path, lock)
    aside = path / f"damaged-{time.strftime('%Y%m%d-%H%M%S')}"
    run, restored = _open_or_restore(path, lock, aside)
    out = Recovery(run=run, restored_manifest=restored)
    try:
        check_for_writing(run)
        out.sound = True
    except DamagedRun:
        pass
    if out.sound:
        out.kept_aside = [str(p) for p in aside.glob("*")]
        return out
    out.kept_aside = [str(p) for p in aside.glob("*")] + \
        set_aside(path, ["checkpoints.sqlite", "checkpoints.sqlite-wal", "checkpoints.sqlite-shm"], aside)
    store = run.store()
    try:
        _seed_checkpoint(run, store, out)
        store.set_meta("status", "recovered")
        store.log_event("recovered", kept_aside=out.kept_aside, merged=out.merged_cycles, closed=out.closed_cycles)
    finally:
        store.close()
    return out


def _start_over(path: Path, lock: RunLock) -> Recovery:
    """--start-over: the store is lost; keep run.json and the task, set every database and best/ aside."""
    try:
        run = RunDir.open(path)
    except RunDirError as e:
        lock.release()
        raise RunDirError(f"{e}; with store.sqlite lost too, nothing is left to start over from") from None
    run.lock = lock
    names = [f"{db}{tail}" for db in ("store.sqlite", "checkpoints.sqlite") for tail in ("", "-wal", "-shm")]
    out = Recovery(run=run, started_over=True, kept_aside=set_aside(path, names + ["best"]))
    run.save()  # a new store, with its copy of run.json
    store = run.store()
    try:
        store.set_meta("status", "recovered")
        store.log_event("recovered", kept_aside=out.kept_aside, started_over=True)
    finally:
        store.close()
    return out


def _open_or_restore(path: Path, lock: RunLock, aside: Path) -> tuple[RunDir, bool]:
    """The run, with run.json put back from the store's copy when it is missing or damaged."""
    try:
        run = RunDir.open(path)
        run.lock = lock
        return run, False
    except RunDirError as damaged:
        store = RunStore(path / "store.sqlite")
        try:
            data = store.get_meta("run_json")
        finally:
            store.close()
        if data is None:
            lock.release()
            raise RunDirError(f"{damaged}; store.sqlite has no copy of it either (a run made before copies were "
                              "kept): restore run.json by hand") from None
        if (path / RUN_FILE).exists():
            aside.mkdir(exist_ok=True)
            (path / RUN_FILE).replace(aside / RUN_FILE)
        write_atomically(path / RUN_FILE, json.dumps(data, indent=2))
        return RunDir.from_manifest(path, data, lock=lock), True


def _seed_checkpoint(run: RunDir, store: RunStore, out: Recovery) -> None:
    snapshots = list(store.db.query("select reason, iteration from world_models order by id"))
    attempts = store.attempts()
    out.attempts = len([a for a in attempts if a["prompt_kind"] != "seed"])
    if not snapshots:
        return  # not initialised yet: `resume` starts again, reusing the seed's measurement and the cached plan
    margin = run.config.noise_margin
    by_cycle: dict[str, list[dict]] = {}
    for a in attempts:
        by_cycle.setdefault(a["cycle_id"], []).append(a)
    merged = [m.group(1) for s in snapshots if (m := _MERGED_BY.search(s["reason"]))]
    merged = list(dict.fromkeys(c for c in merged if c in by_cycle))  # in order, once each
    best = None
    seed = (by_cycle.get("seed") or [None])[0]
    if seed is not None and seed["status"] == "passed":
        best = best_entry(seed, ROOT)
    for cycle_id in merged:
        cycle_best = _cycle_best(by_cycle[cycle_id], margin)
        if cycle_best and (best is None or cycle_best["score"] > best["score"] * (1 + margin)):
            best = best_entry(cycle_best, by_cycle[cycle_id][0]["node_id"])
    finished = []
    for cycle_id, rows in sorted(by_cycle.items(), key=lambda kv: kv[1][0]["iteration"]):
        if cycle_id == "seed" or cycle_id in merged:
            continue
        cycle_best = _cycle_best(rows, margin)
        finished.append({"cycle_id": cycle_id, "node_id": rows[0]["node_id"],
                         "best": attempt_summary(cycle_best) if cycle_best else None, "n_attempts": len(rows),
                         "stop": "closed by ksearch recover at its last evaluated attempt"})
    tree = json.loads(next(store.db.query("select tree from world_models order by id desc limit 1"))["tree"])
    values = {
        "world_model": tree,
        "iterations_done": sum(len(by_cycle[c]) for c in merged),
        "cycle_seq": _highest_cycle_number(store),
        "merged_cycles": (["seed"] if seed is not None else []) + merged,
        "best": best,
        "stop_reason": None,
        "selected": [],
        "finished_cycles": finished,
        "last_node": "action_cycle" if finished else "update_world_model",
    }
    saver = run.checkpointer()
    try:
        build_search_graph(saver).update_state(run.graph_config(), values, as_node=values["last_node"])
    finally:
        saver.conn.close()
    out.rebuilt = True
    out.merged_cycles = merged
    out.closed_cycles = [f["cycle_id"] for f in finished]
    out.world_model_from = f"{snapshots[-1]['reason']} (iteration {snapshots[-1]['iteration']})"


def _cycle_best(rows: list[dict], margin: float) -> dict | None:
    """The cycle's best attempt by the reflection's rule: a pass that beats the best so far by the margin."""
    best = None
    for a in sorted(rows, key=lambda r: r["iteration"]):
        if a["status"] == "passed" and (best is None or a["score"] > best["score"] * (1 + margin)):
            best = a
    return best


def _highest_cycle_number(store: RunStore) -> int:
    from ksearch_graph.rundir.integrity import store_cycle_numbers

    return max(store_cycle_numbers(store.db.conn), default=0)
