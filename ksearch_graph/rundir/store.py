"""The run's artifact database (``store.sqlite`` in the run directory, sqlite-utils, WAL).

Graph state stays small (ids, counters, the compact tree); everything big lives here:
- ``sources``: candidate code, stored once per content hash,
- ``attempts``: every attempt with its lineage, prompt kind, full evaluation result and log excerpt,
- ``generations``: each code/plan generation keyed by a deterministic id, so a node re-run after a
  crash reuses the answer instead of paying for it twice,
- ``llm_calls``: the token/cost ledger per role,
- ``exchanges``: every prompt sent to an LLM and its raw answer, compressed, under the generation's key
  (``transcripts.py``),
- ``world_models``: a snapshot of the tree after every update,
- ``events``: a chronological log for progress views and reports.

Several action cycles may write at once (threads), so every write takes a lock; SQLite in WAL mode
lets readers (``ksearch show`` from another shell) look in while a run is writing. After every write the WAL
is copied into store.sqlite (a passive checkpoint): the main file alone holds everything committed, so a WAL
file lost or cut after a crash loses at most the one write in flight, which no checkpoint refers to yet.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import sqlite_utils

from ksearch_graph.tasks.evaluation import EvalResult

_SCHEMA = {
    "sources": ({"hash": str, "files": str, "created": float}, "hash"),
    "attempts": (
        {
            "id": str,
            "iteration": int,
            "cycle_id": str,
            "node_id": str,
            "prompt_kind": str,
            "base_attempt_id": str,
            "parent_attempt_id": str,
            "source_hash": str,
            "status": str,
            "score": float,
            "latency_us": float,
            "result": str,
            "log_excerpt": str,
            "prompt_tokens": int,
            "completion_tokens": int,
            "codegen_s": float,
            "eval_s": float,
            "created": float,
        },
        "id",
    ),
    "generations": ({"key": str, "payload": str, "created": float}, "key"),
    "llm_calls": (
        {
            "id": int,
            "role": str,
            "purpose": str,
            "prompt_tokens": int,
            "completion_tokens": int,
            "cost_usd": float,
            "seconds": float,
            "created": float,
            "cached_prompt_tokens": int,
        },
        "id",
    ),
    "exchanges": ({"key": str, "role": str, "purpose": str, "data": bytes, "created": float}, "key"),
    "world_models": ({"id": int, "iteration": int, "reason": str, "tree": str, "created": float}, "id"),
    "events": ({"id": int, "kind": str, "data": str, "created": float}, "id"),
    "meta": ({"key": str, "value": str}, "key"),
}


def _locked(method):
    """Every DB access holds the store's lock: cycles run in threads and share one connection."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper


def _writes(method):
    """A locked write, then the WAL copied into the main file (without waiting for readers)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._lock:
            out = method(self, *args, **kwargs)
            self._settle()
            return out

    return wrapper


def source_hash(files: dict[str, str]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    return h.hexdigest()[:16]


def attempt_summary(row: dict[str, Any]) -> dict[str, Any]:
    """What graph state keeps about an attempt (the store has the rest)."""
    return {
        "id": row["id"],
        "status": row["status"],
        "score": row["score"],
        "latency_us": row["latency_us"],
        "prompt_kind": row["prompt_kind"],
        "source_hash": row["source_hash"],
    }


class RunStore:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        conn = sqlite3.connect(str(self.path), check_same_thread=False, timeout=30)
        self.db = sqlite_utils.Database(conn)
        self.db.enable_wal()
        self._lock = threading.RLock()
        self.read_only = False
        try:
            for name, (columns, pk) in _SCHEMA.items():
                if not self.db[name].exists():
                    self.db[name].create(columns, pk=pk)
                else:  # a run directory from before a column existed: add it (old rows read as null)
                    for column, kind in columns.items():
                        if column not in self.db[name].columns_dict:
                            self.db[name].add_column(column, kind)
        except sqlite3.OperationalError as e:
            if "readonly" not in str(e):
                raise
            # A read-only copy of an older run: readable as it is (the readers below do without what it lacks).
        if not self.db["attempts"].indexes:
            self.db["attempts"].create_index(["cycle_id"])
        self._settle()

    @classmethod
    def reader(cls, path: str | Path, *, live: bool = False) -> RunStore:
        """A reader's store: nothing is created or changed beside the file (sqlite_snapshot.py; ``live``: its writer
        runs now); writes fail."""
        from ksearch_graph.rundir.sqlite_snapshot import open_read_only

        store = cls.__new__(cls)
        store.path = Path(path)
        store.db = sqlite_utils.Database(open_read_only(store.path, live=live))
        store._lock = threading.RLock()
        store.read_only = True
        return store

    def _settle(self) -> None:
        """Copy the WAL into store.sqlite (passive: readers are never waited for; skipped inside a transaction)."""
        if not self.db.conn.in_transaction:
            self.db.execute("pragma wal_checkpoint(passive)")

    @_locked
    def close(self) -> None:
        self.db.conn.close()

    # ------------------------------------------------------------------ sources and generations

    @_writes
    def put_source(self, files: dict[str, str]) -> str:
        digest = source_hash(files)
        self.db["sources"].insert(
            {"hash": digest, "files": json.dumps(files), "created": time.time()}, ignore=True
        )
        return digest

    @_locked
    def get_source(self, digest: str) -> dict[str, str]:
        return json.loads(self.db["sources"].get(digest)["files"])

    @_locked
    def get_generation(self, key: str) -> dict | None:
        rows = list(self.db.query("select payload from generations where key = ?", [key]))
        return json.loads(rows[0]["payload"]) if rows else None

    @_locked
    def generations_with_prefix(self, prefix: str) -> list[dict]:
        """Cached generations whose key starts with ``prefix``: [{"key", "payload", "created"}]."""
        rows = self.db.query("select key, payload, created from generations where substr(key, 1, ?) = ?",
                             [len(prefix), prefix])
        return [{"key": r["key"], "payload": json.loads(r["payload"]), "created": r["created"]} for r in rows]

    @_writes
    def put_generation(self, key: str, payload: dict) -> None:
        self.db["generations"].insert(
            {"key": key, "payload": json.dumps(payload), "created": time.time()}, replace=True
        )

    # ------------------------------------------------------------------ attempts

    @_locked
    def get_attempt(self, attempt_id: str) -> dict | None:
        rows = list(self.db.query("select * from attempts where id = ?", [attempt_id]))
        return rows[0] if rows else None

    @_writes
    def record_attempt(
        self,
        *,
        attempt_id: str,
        cycle_id: str,
        node_id: str,
        prompt_kind: str,
        base_attempt_id: str | None,
        parent_attempt_id: str | None,
        source_hash: str,
        result: EvalResult,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        codegen_s: float = 0.0,
        eval_s: float = 0.0,
    ) -> dict:
        """Insert an evaluated attempt once. Returns the stored row (the existing one on a re-run)."""
        existing = self.get_attempt(attempt_id)
        if existing is not None:
            return existing
        row = {
            "id": attempt_id,
            # The seed solution is measured but is not an iteration of the search.
            "iteration": 0 if prompt_kind == "seed" else self.count_attempts() + 1,
            "cycle_id": cycle_id,
            "node_id": node_id,
            "prompt_kind": prompt_kind,
            "base_attempt_id": base_attempt_id,
            "parent_attempt_id": parent_attempt_id,
            "source_hash": source_hash,
            "status": result.status.value,
            "score": result.score,
            "latency_us": result.latency_us,
            "result": result.model_dump_json(),
            "log_excerpt": result.log_excerpt,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "codegen_s": codegen_s,
            "eval_s": eval_s,
            "created": time.time(),
        }
        self.db["attempts"].insert(row)
        return row

    @_locked
    def cycle_attempts(self, cycle_id: str) -> list[dict]:
        """Summaries of one cycle's attempts, oldest first."""
        rows = self.db.query("select * from attempts where cycle_id = ? order by iteration", [cycle_id])
        return [attempt_summary(r) for r in rows]

    @_locked
    def has_cycle(self, cycle_id: str) -> bool:
        """Whether any attempt (or cached generation) was made under this cycle id."""
        if self.db.execute("select 1 from attempts where cycle_id = ? limit 1", [cycle_id]).fetchone():
            return True
        return bool(self.db.execute("select 1 from generations where key like ? limit 1", [cycle_id + ".%"]).fetchone())

    @_locked
    def count_attempts(self) -> int:
        return self.db.execute("select count(*) from attempts where prompt_kind != 'seed'").fetchone()[0]

    @_locked
    def attempts(self) -> list[dict]:
        return list(self.db.query("select * from attempts order by iteration, created"))

    @_locked
    def active_seconds(self) -> float:
        """Time spent generating and evaluating, summed over every process that worked on the run."""
        a = self.db.execute("select coalesce(sum(codegen_s + eval_s), 0) from attempts").fetchone()[0]
        b = self.db.execute("select coalesce(sum(seconds), 0) from llm_calls where purpose != 'code'").fetchone()[0]
        return float(a + b)

    # ------------------------------------------------------------------ ledger

    @_writes
    def record_llm_call(self, role: str, purpose: str, usage: dict, seconds: float) -> None:
        self.db["llm_calls"].insert(
            {
                "role": role,
                "purpose": purpose,
                "prompt_tokens": int(usage.get("prompt_tokens", 0)),
                "completion_tokens": int(usage.get("completion_tokens", 0)),
                "cost_usd": float(usage.get("cost_usd", 0.0)),
                "seconds": seconds,
                "created": time.time(),
                "cached_prompt_tokens": int(usage.get("cached_prompt_tokens", 0)),
            }
        )

    @_writes
    def record_exchanges(self, key: str, role: str, purpose: str, transcript: list[dict]) -> None:
        """The prompts and raw answers of one generation (``key`` as in ``generations``), compressed; a re-run
        replaces them."""
        from ksearch_graph.rundir.transcripts import pack

        if transcript:
            self.db["exchanges"].insert({"key": key, "role": role, "purpose": purpose, "data": pack(transcript),
                                         "created": time.time()}, replace=True)

    @_locked
    def exchanges(self, prefix: str = "") -> list[dict]:
        """Recorded exchanges whose key starts with ``prefix``, oldest first: [{"key", "role", "purpose",
        "transcript", "created"}]."""
        from ksearch_graph.rundir.transcripts import unpack

        if not self.db["exchanges"].exists():
            return []
        rows = self.db.query("select * from exchanges where substr(key, 1, ?) = ? order by created",
                             [len(prefix), prefix])
        return [{"key": r["key"], "role": r["role"], "purpose": r["purpose"], "transcript": unpack(r["data"]),
                 "created": r["created"]} for r in rows]

    @_locked
    def token_totals(self) -> dict[str, Any]:
        cached = "cached_prompt_tokens" if "cached_prompt_tokens" in self.db["llm_calls"].columns_dict else "0"
        per_role = {
            r["role"]: {k: r[k] or 0 for k in ("prompt_tokens", "cached_prompt_tokens", "completion_tokens",
                                               "cost_usd", "calls")}
            for r in self.db.query(
                f"select role, sum(prompt_tokens) prompt_tokens, sum({cached}) cached_prompt_tokens, "
                "sum(completion_tokens) completion_tokens, sum(cost_usd) cost_usd, count(*) calls from llm_calls "
                "group by role"
            )
        }
        total = sum(v["prompt_tokens"] + v["completion_tokens"] for v in per_role.values())
        cost = sum(v["cost_usd"] for v in per_role.values())
        return {"total_tokens": total, "cost_usd": round(cost, 6), "per_role": per_role}

    # ------------------------------------------------------------------ world models, events, meta

    @_writes
    def snapshot_world_model(self, tree: dict, *, iteration: int, reason: str) -> None:
        self.db["world_models"].insert(
            {"iteration": iteration, "reason": reason, "tree": json.dumps(tree), "created": time.time()}
        )

    @_locked
    def analysis(self) -> str:
        """The planner's analysis of the task, as the latest world-model snapshot keeps it ("" before one)."""
        row = self.db.execute("select json_extract(tree, '$.analysis') from world_models order by id desc "
                              "limit 1").fetchone()
        return (row[0] or "") if row else ""

    @_writes
    def log_event(self, kind: str, **data: Any) -> None:
        self.db["events"].insert({"kind": kind, "data": json.dumps(data, default=str), "created": time.time()})

    @_locked
    def events(self, kind: str | None = None) -> list[dict]:
        sql, args = "select * from events", []
        if kind:
            sql, args = sql + " where kind = ?", [kind]
        return [dict(r, data=json.loads(r["data"])) for r in self.db.query(sql + " order by id", args)]

    @_writes
    def set_meta(self, key: str, value: Any) -> None:
        self.db["meta"].insert({"key": key, "value": json.dumps(value)}, replace=True)

    @_locked
    def get_meta(self, key: str, default: Any = None) -> Any:
        rows = list(self.db.query("select value from meta where key = ?", [key]))
        return json.loads(rows[0]["value"]) if rows else default

    # ------------------------------------------------------------------ branching

    @_writes
    def keep_only_cycles(self, cycle_ids: set[str]) -> int:
        """Forget every cycle not in ``cycle_ids`` (on a branch's copy): its attempts and its cached
        code and planner answers, which a later cycle of the branch with the same id must not reuse.
        Returns how many attempts went."""
        doomed = [r["id"] for r in self.db.query("select id, cycle_id from attempts") if r["cycle_id"] not in cycle_ids]
        for attempt_id in doomed:
            self.db["attempts"].delete(attempt_id)
        for table in ("generations", "exchanges"):
            for (key,) in self.db.execute(f"select key from {table}").fetchall():
                cycle = _cycle_of_generation(key)
                if cycle is not None and cycle not in cycle_ids:
                    self.db.execute(f"delete from {table} where key = ?", [key])
        # The world models and events of the forgotten cycles' future go too: `ksearch recover` reads them.
        for row_id, reason in self.db.execute("select id, reason from world_models").fetchall():
            cycle = _cycle_of_update(reason)
            if cycle is not None and cycle not in cycle_ids:
                self.db.execute("delete from world_models where id = ?", [row_id])
        for row_id, cycle in self.db.execute("select id, json_extract(data, '$.cycle_id') from events").fetchall():
            if cycle is not None and cycle not in cycle_ids:
                self.db.execute("delete from events where id = ?", [row_id])
        self.db.conn.commit()
        return len(doomed)

    @_writes
    def end_cycle_at(self, cycle_id: str, steps: int) -> None:
        """Forget what a cycle did after its first ``steps`` steps (c3.4, or the samples c3.4.1 ... are step 4), and
        its world-model update (on the copy of a branch at an attempt); then number the attempts 1, 2, ... again."""
        def later(attempt_id: str) -> bool:
            return attempt_id.startswith(cycle_id + ".") and int(attempt_id.split(".")[1].split(":")[0]) > steps

        for (attempt_id,) in self.db.execute("select id from attempts where cycle_id = ?", [cycle_id]).fetchall():
            if later(attempt_id):
                self.db.execute("delete from attempts where id = ?", [attempt_id])
        for table in ("generations", "exchanges"):
            for (key,) in self.db.execute(f"select key from {table}").fetchall():
                if later(key) or key.startswith(f"update:{cycle_id}:"):
                    self.db.execute(f"delete from {table} where key = ?", [key])
        for row_id, reason in self.db.execute("select id, reason from world_models").fetchall():
            if _cycle_of_update(reason) == cycle_id:
                self.db.execute("delete from world_models where id = ?", [row_id])
        self.db.execute("update attempts set iteration = (select count(*) from attempts b where b.prompt_kind != "
                        "'seed' and b.iteration <= attempts.iteration) where prompt_kind != 'seed'")
        self.db.conn.commit()


def _cycle_of_update(reason: str) -> str | None:
    """The cycle a world-model snapshot belongs to: 'update after c3' / 'too-hard update after c3' -> c3, and the
    refill before it, 'refill before c3' -> c3."""
    if reason and ("update after " in reason or reason.startswith("refill before ")):
        return reason.rsplit(" ", 1)[1]
    return None


def _cycle_of_generation(key: str) -> str | None:
    """The cycle a cached generation belongs to: 'c3.2:code' -> c3, 'update:c3:0' -> c3, 'init:0' -> None
    (rolling cycles: 'merge:c3' and 'round:c3' -> c3; the refill before a cycle: 'refill:c3:0' -> c3)."""
    head = key.split(":")
    if head[0] in ("update", "merge", "round", "refill"):
        return head[1]
    if "." in head[0]:
        return head[0].split(".")[0]
    return None
