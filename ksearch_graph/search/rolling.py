"""Rolling cycles: k lanes that never wait for each other.

A round starts k cycles (``select_plans``). In rounds mode the world model is updated once all k have ended, so a
lane whose cycle ended early idles until the slowest ends. Here each lane, when its cycle ends, merges the result
into the round's live search state (the world model, the best, the counters) and claims the next plan at once; the
round ends when every lane has found nothing more to do.

A lane that finds no open action free (or the budget claimed by the running lanes) waits for another lane's merge,
which brings the planner's new actions or gives back unspent budget; that merge hands it its next cycle. A lane ends
when the budget is spent, a cap is hit, or no other lane is running (then nothing more can come). With more lanes
than the frontier has actions at the start, the extra lanes begin waiting.

The live state is shared by the lanes' threads under one lock, and every merge is written to the store as one
record, ``merge:<cycle id>`` (the state after the merge, and the cycle the lane claimed next), before the lane moves
on. That record is the commit: a lane re-run after a crash finds it and continues with the same next cycle, so no
merge happens twice and no claimed cycle is lost. The waiting lanes are part of each record, and the cycle (or the
end) a merge hands a waiting lane is written in that merge's record, so a lane re-run after a crash finds what it
was handed, or waits again. The planner's answer is asked outside the lock (on the state as it
was) and cached under its usual key; the merge under the lock replays it on the state as it is now.

A lane that fails (a full disk, a dead endpoint) ends the process's run: LangGraph waits for every lane's thread
before it reports the failure, so the waiting lanes are woken and fail with the same error (``lane``); the round is
rebuilt from its commits by the next run.
"""

from __future__ import annotations

import contextlib
import copy
import math
import threading

from langgraph.errors import GraphBubbleUp
from langgraph.runtime import Runtime

from ksearch_graph.search.context import SearchContext, search_context
from ksearch_graph.search.cycles import new_cycle
from ksearch_graph.search.merge import merge_cycle
from ksearch_graph.search.policy import select_actions
from ksearch_graph.search.state import CycleState, SearchState
from ksearch_graph.search.world_model import WorldModel

STATE_KEYS = ("world_model", "best", "iterations_done", "merged_cycles", "cycle_seq")

_rounds: dict[tuple[str, str], RollingRound] = {}
_rounds_lock = threading.Lock()


WAKE_CHECK_S = 5.0  # a waiting lane re-checks this often (it is woken at once by every merge)


class RollingRound:
    def __init__(self, round_id: str, record: dict, handoffs: dict[str, dict]):
        self.round_id = round_id
        self.record = record  # the latest commit: {"round", "seq", "state", "active", "waiting", ...}
        self.handoffs = handoffs  # waiting lane -> what a merge handed it: {"next": cycle or None, "lane_end": ...}
        self.lock = threading.Condition()
        self.failure: BaseException | None = None  # a lane's error, which ends every waiting lane
        self.lanes_running = 0  # lanes of this process inside their cycle (lane()), failed or not

    def merge_and_claim(self, ctx: SearchContext, runtime: Runtime[SearchContext], result: dict) -> dict:
        """Merge a finished cycle and claim its lane's next cycle (and the waiting lanes'), once. Returns the commit
        record: ``next`` is the lane's next cycle; else ``waits`` (wait for a hand-off) or ``lane_end``."""
        key = f"merge:{result['cycle_id']}"
        done = ctx.store.get_generation(key)
        if done is not None:
            return done
        if self.failure is not None:  # the run is ending: claim nothing more (a resume merges this cycle)
            raise self.failure
        with self.lock:
            before = copy.deepcopy(self.record["state"])
        merge_cycle(ctx, None, WorldModel.from_state(before["world_model"]), before["best"], result,
                    iterations=before["iterations_done"])  # the planner's answer, outside the lock
        with self.lock:
            state = self.record["state"]
            iterations = state["iterations_done"] + result["n_attempts"]
            wm, best = merge_cycle(ctx, runtime, WorldModel.from_state(state["world_model"]), state["best"], result,
                                   iterations=iterations)
            active = {cid: c for cid, c in self.record["active"].items() if cid != result["cycle_id"]}
            merged = [result["cycle_id"]] if result["n_attempts"] else []  # a halted cycle made no attempt
            after = {"world_model": wm.to_state(), "best": best, "iterations_done": iterations,
                     "merged_cycles": state["merged_cycles"] + merged, "cycle_seq": state["cycle_seq"]}
            waiting = list(self.record.get("waiting", []))
            handoff: dict[str, dict] = {}
            nxt, why_not, final = self._claim_into(ctx, wm, after, active)
            reason = why_not
            if nxt is not None:  # then the waiting lanes, longest waiting first
                for lane in list(waiting):
                    cycle, reason, final = self._claim_into(ctx, wm, after, active)
                    if cycle is None:
                        break
                    handoff[lane] = {"next": cycle, "lane_end": None}
                    waiting.remove(lane)
            waits = nxt is None and not final and bool(active)
            if waits:
                waiting.append(result["cycle_id"])
            elif final or not active:  # nothing more can come: every waiting lane ends
                reason = reason if final else f"{reason}, and no other lane is running"
                handoff.update({lane: {"next": None, "lane_end": reason} for lane in waiting})
                waiting = []
            record = {"round": self.round_id, "seq": self.record["seq"] + 1, "cycle": result["cycle_id"],
                      "state": after, "active": active, "next": nxt, "waits": waits,
                      "lane_end": None if nxt is not None or waits else reason,
                      "waiting": waiting, "handoff": handoff}
            ctx.store.put_generation(key, record)
            self.record = record
            self.handoffs.update(handoff)
            self.lock.notify_all()
        return record

    def _claim_into(self, ctx: SearchContext, wm: WorldModel, state: dict,
                    active: dict) -> tuple[dict | None, str | None, bool]:
        nxt, why_not, final = _claim(ctx, wm, state, active, self.round_id)
        if nxt is not None:
            state["cycle_seq"] += 1
            active[nxt["id"]] = {"node_id": nxt["node_id"], "allowance": nxt["allowance"]}
        return nxt, why_not, final

    def wait_for_handoff(self, lane: str) -> dict:
        """Block until a merge hands ``lane`` its next cycle or ends it: {"next": cycle or None, "lane_end": ...}.
        Bounded: every merge hands out what it can, and the last running lane's merge ends every waiting lane."""
        with self.lock:
            while lane not in self.handoffs:
                if self.failure is not None:
                    raise self.failure  # the failing lane's error: whichever lane LangGraph reports, it is that one
                self.lock.wait(WAKE_CHECK_S)
            return self.handoffs[lane]

    @contextlib.contextmanager
    def lane_running(self):
        with self.lock:
            self.lanes_running += 1
        try:
            yield
        finally:
            with self.lock:
                self.lanes_running -= 1

    def fail(self, error: BaseException) -> None:
        """A lane failed: wake the waiting lanes, which fail with ``error`` (no merge of that lane will come)."""
        with self.lock:
            if self.failure is None:
                self.failure = error
            self.lock.notify_all()


def _claim(ctx: SearchContext, wm: WorldModel, state: dict, active: dict,
           round_id: str) -> tuple[dict | None, str | None, bool]:
    """The lane's next cycle: the best open action no other lane is on, with a share of the unclaimed budget.
    Else why not, and whether that is final (budget spent, cap hit) or may change with another lane's merge."""
    budget = ctx.config.budget.iterations
    stop = ctx.budget.stop_reason()  # the run's record: attempts recorded and in flight, caps
    if stop is not None:
        return None, stop, True
    if state["iterations_done"] >= budget:
        return None, "the iteration budget is spent", True
    unclaimed = budget - state["iterations_done"] - sum(c["allowance"] for c in active.values())
    if unclaimed <= 0:
        return None, "the iteration budget is claimed by the other lanes", False
    picks = select_actions(wm, 1, policy=ctx.config.policy, difficulty_cap=ctx.config.difficulty_cap,
                           exclude={c["node_id"] for c in active.values()})
    if not picks:
        return None, "no open action that another lane is not on", False
    allowance = max(1, math.ceil(unclaimed / ctx.config.parallel_cycles))
    best_score = (state["best"] or {}).get("score", 0.0)
    cycle = new_cycle(ctx, wm, picks[0], state["cycle_seq"] + 1, allowance, best_score, state["iterations_done"])
    return cycle | {"round": round_id}, None, False


def lane(cycle_graph):
    """The main graph's node for one cycle: the cycle subgraph, run so that its failure (in a node, or writing a
    checkpoint between nodes) also ends the rolling lanes waiting for its merge, which would otherwise wait forever
    (LangGraph reports a failed task only once every other task of the step has returned)."""
    shared = set(SearchState.__annotations__)

    def action_cycle(state: CycleState, runtime: Runtime) -> dict:
        round_id = (state.get("cycle") or {}).get("round")
        if not round_id:
            return _shared(cycle_graph.invoke(state), shared)
        ctx = search_context(runtime)
        live = live_round(ctx, round_id)
        with live.lane_running():
            try:
                return _shared(cycle_graph.invoke(state), shared)
            except GraphBubbleUp:  # LangGraph's own control flow, not a failure
                raise
            except BaseException as e:
                live.fail(e)
                raise

    return action_cycle


def _shared(values: dict, keys: set[str]) -> dict:
    """The cycle's final state, as the main graph takes it: the keys the two states share."""
    return {k: v for k, v in values.items() if k in keys}


def start_round(ctx: SearchContext, cycles: list[dict], waiting: list[dict], state: dict) -> None:
    """Mark the launched cycles and waiting lanes as one rolling round and write its starting state
    (``round:<id>``)."""
    round_id = cycles[0]["id"]
    for c in cycles + waiting:
        c["round"] = round_id
    record = {"round": round_id, "seq": 0, "state": {k: state.get(k) for k in STATE_KEYS},
              "active": {c["id"]: {"node_id": c["node_id"], "allowance": c["allowance"]} for c in cycles},
              "waiting": [w["id"] for w in waiting]}
    record["state"]["merged_cycles"] = list(record["state"]["merged_cycles"] or [])
    record["state"]["iterations_done"] = record["state"]["iterations_done"] or 0
    ctx.store.put_generation(f"round:{round_id}", record)
    with _rounds_lock:
        _rounds.pop((str(ctx.store.path), round_id), None)


def waiting_lane(round_id: str, i: int) -> dict:
    """The launch payload of a lane that starts waiting (no free action for it yet)."""
    return {"id": f"{round_id}.lane{i}", "waiting": True}


def live_round(ctx: SearchContext, round_id: str) -> RollingRound:
    """The round's shared live state: in memory while this process runs it, else rebuilt from its commits."""
    key = (str(ctx.store.path), round_id)
    with _rounds_lock:
        # A round that failed is rebuilt from its commits once none of its lanes runs: a later run of this process
        # (a server resuming the thread) starts clean, while the failed run's lanes all see the failure.
        if key in _rounds and _rounds[key].failure is not None and _rounds[key].lanes_running == 0:
            del _rounds[key]
        if key not in _rounds:
            records = round_records(ctx.store, round_id)
            handoffs = {lane: h for r in records for lane, h in r.get("handoff", {}).items()}
            _rounds[key] = RollingRound(round_id, records[-1], handoffs)
        return _rounds[key]


def round_records(store, round_id: str) -> list[dict]:
    """The round's start record and its merges, in commit order."""
    start = store.get_generation(f"round:{round_id}")
    if start is None:
        raise RuntimeError(f"rolling round {round_id} has no record in the store")
    merges = [r["payload"] for r in store.generations_with_prefix("merge:") if r["payload"].get("round") == round_id]
    return [start] + sorted(merges, key=lambda r: r["seq"])


def latest_record(store, round_id: str) -> dict:
    return round_records(store, round_id)[-1]


def round_state(ctx: SearchContext, round_id: str) -> dict:
    """The search state a finished round leaves (for the main graph's update_world_model)."""
    with _rounds_lock:
        _rounds.pop((str(ctx.store.path), round_id), None)
    return copy.deepcopy(latest_record(ctx.store, round_id)["state"])


def merge_points(store) -> list[dict]:
    """Every rolling merge of the run, oldest first: {"id": "merge:c7", "state": ..., "created": ...}."""
    rows = store.generations_with_prefix("merge:")
    return sorted(({"id": r["key"], "state": r["payload"]["state"], "created": r["created"]} for r in rows),
                  key=lambda r: r["created"])
