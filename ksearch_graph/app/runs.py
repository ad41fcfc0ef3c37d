"""Driving a search in a run directory: start, resume, branch, and read back its history.

These work on a run directory as it is; launch.py adds the checks (the pool, its GPU model, preflight) that come
before a run, a resume or a campaign writes anything. Tests and other programs can call either directly.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langgraph.types import Command

from ksearch_graph.config import SearchConfig
from ksearch_graph.rundir.gpu_record import keep_to_branch
from ksearch_graph.rundir.integrity import check_for_writing, open_for_reading
from ksearch_graph.rundir.run_dir import RunDir, RunDirError, copy_sqlite
from ksearch_graph.rundir.store import attempt_summary
from ksearch_graph.search.context import SearchContext
from ksearch_graph.search.graph import build_search_graph
from ksearch_graph.search.world_model import ROOT, WorldModel
from ksearch_graph.search.world_model_edits import check_invariants

EventSink = Callable[[dict], None]


def drive(run: RunDir, ctx: SearchContext, *, fresh: bool, on_event: EventSink | None = None,
          checkpoint_id: str | None = None, answer: Any = None) -> dict:
    """Run the graph until it finishes, waits for a person (``pending_question``), or raises.
    Returns the state values. ``answer`` resumes a run waiting on a question.

    ``durability="sync"``: every checkpoint is on disk before the next step starts, so a kill -9
    loses at most the step in flight (docs/run-dirs.md).
    """
    graph = build_search_graph(run.checkpointer())
    config = run.graph_config(checkpoint_id)
    # Threads for the cycles side by side (LangGraph's default is cores + 4); the pool bounds the evaluations.
    config["max_concurrency"] = 64
    ctx.store.set_meta("status", "running")
    try:
        for _namespace, mode, chunk in graph.stream(
            Command(resume=answer) if answer is not None else ({} if fresh else None),
            config,
            context=ctx,
            stream_mode=["custom"],
            subgraphs=True,
            durability="sync",
        ):
            if on_event is not None and mode == "custom":
                on_event(chunk)
    finally:
        # The evaluator may hold the next evaluation's processes, started ahead (GPU hosts): no GPU memory is
        # kept for a search that has stopped. It stays usable; a later drive() starts them again.
        close = getattr(ctx.evaluator, "close", None)
        if close is not None:
            close()
    return graph.get_state(run.graph_config()).values


def pending_question(run: RunDir) -> dict | None:
    """The question a run waits on (plan approval), or None."""
    graph = build_search_graph(run.checkpointer())
    interrupts = graph.get_state(run.graph_config()).interrupts
    return interrupts[0].value if interrupts else None


def start(task_folder: str | Path, run_dir: str | Path, config: SearchConfig) -> RunDir:
    return RunDir.create(run_dir, task_folder, config)


def is_finished(run: RunDir) -> bool:
    graph = build_search_graph(run.checkpointer())
    snap = graph.get_state(run.graph_config())
    return bool(snap.values) and not snap.next


def has_started(run: RunDir) -> bool:
    graph = build_search_graph(run.checkpointer())
    return bool(graph.get_state(run.graph_config()).values)


def extend(run: RunDir, iterations: int) -> bool:
    """Raise the iteration budget; a finished run re-enters plan selection. Returns True if reopened."""
    run.config.budget.iterations = iterations
    run.save()
    graph = build_search_graph(run.checkpointer())
    snap = graph.get_state(run.graph_config())
    if snap.values and not snap.next and snap.values.get("iterations_done", 0) < iterations:
        graph.update_state(run.graph_config(), {"stop_reason": None}, as_node="update_world_model")
        return True
    return False


# ---------------------------------------------------------------------- history and branching


def branch(src_dir: str | Path, checkpoint_id: str, into: str | Path, *, world_model_file: str | Path | None = None) -> RunDir:
    """A new run starting at ``checkpoint_id`` of ``src_dir`` (optionally with an edited world model).

    The source run is only read. The branch gets a copy of the task, the settings, and the store
    rows of the cycles that belong to the checkpoint's past; its own history starts at the fork.
    """
    src = open_for_reading(src_dir)
    graph = build_search_graph(src.checkpointer())
    if checkpoint_id.startswith("merge:"):  # a rolling merge: the search state it committed, before the next plans
        values, as_node, has_next = _values_at_merge(src, checkpoint_id), "update_world_model", True
    else:
        snap = graph.get_state(src.graph_config(checkpoint_id))
        values, has_next = dict(snap.values or {}), bool(snap.next)
        as_node = values.get("last_node")
    if not values:
        raise RunDirError(f"{src.path} has no checkpoint {checkpoint_id} (see `ksearch history {src.path}`)")
    if not as_node:
        raise RunDirError("that checkpoint is the run's input; branch from a later one")
    if not has_next:
        raise RunDirError("that checkpoint is the end of the run; branch from an earlier one "
                          "(or `ksearch resume DIR --iterations N` to continue it)")
    if world_model_file is not None:
        values["world_model"] = _load_edited_world_model(world_model_file, values["world_model"])
    keep = set(values.get("merged_cycles", [])) | {r["cycle_id"] for r in values.get("finished_cycles", [])}
    with _new_branch(src, into, {"checkpoint": checkpoint_id, "edited_world_model": world_model_file is not None}) \
            as new:
        store = new.store()
        try:
            store.keep_only_cycles(keep)
            keep_to_branch(store)
            store.set_meta("status", "branched")
            store.log_event("branched", source=str(src.path), checkpoint=checkpoint_id,
                            edited=world_model_file is not None)
            if world_model_file is not None:
                store.snapshot_world_model(values["world_model"], iteration=values.get("iterations_done", 0),
                                           reason="edited at branch")
        finally:
            store.close()
        # Re-enter the graph as if ``as_node`` had just produced these values: its outgoing edges (and
        # Sends, after select_plans) run from here, so the branch continues exactly from that point.
        _seed_state(new, values, as_node)
    return new


def _seed_state(run: RunDir, values: dict, as_node: str) -> None:
    saver = run.checkpointer()
    try:
        build_search_graph(saver).update_state(run.graph_config(), values, as_node=as_node)
    finally:
        saver.conn.close()


def _values_at_merge(run: RunDir, merge_id: str) -> dict:
    store = run.store()
    try:
        record = store.get_generation(merge_id)
    finally:
        store.close()
    if record is None or "state" not in record:
        return {}
    return {**record["state"], "selected": [], "finished_cycles": [], "stop_reason": None,
            "last_node": "update_world_model"}
def branch_at_attempt(src_dir: str | Path, attempt_id: str, into: str | Path) -> RunDir:
    """A new run that continues the cycle of ``attempt_id`` right after it, from its code.

    The world model is the one that cycle was launched on; the cycle's later attempts (and its update) are not
    part of the branch, nor are cycles that ran side by side with it (their nodes stay open). The next attempt
    improves on ``attempt_id``'s code; the cycle then goes on as any other. A sample's id (``c3.4.2``, with
    ``--samples``) ends the cycle after step 4, that sample standing as the step's result.
    """
    src = open_for_reading(src_dir)
    store = src.store()
    try:
        row = store.get_attempt(attempt_id)
        cycle_ids = [a["id"] for a in store.cycle_attempts(row["cycle_id"])] if row else []
    finally:
        store.close()
    example = "c3.4 (cycle c3, attempt 4)" if src.config.samples == 1 else \
        f"c3.4.1 (cycle c3, step 4, sample 1 of {src.config.samples})"
    if row is not None and row["prompt_kind"] == "seed":
        raise RunDirError("the seed is no cycle's attempt; branch from the checkpoint after initialisation with --at "
                          f"(see `ksearch history {src.path}`)")
    if attempt_step(attempt_id) is None:
        raise RunDirError(f"{attempt_id!r} is not an attempt id; this run's attempt ids look like {example} "
                          f"(see `ksearch report {src.path}`)")
    if row is None:
        raise RunDirError(f"{src.path} has no attempt {attempt_id!r}; this run's attempt ids look like {example} "
                          f"(see `ksearch report {src.path}`)")
    if row["status"] != "passed":
        raise RunDirError(f"{attempt_id} did not pass ({row['status']}); a branch continues from an attempt's code, "
                          "so pick a passing one (or branch at a checkpoint with --at)")
    # With --samples the step's other samples stay in the past too; this sample stands as the step's result.
    cycle_id, step = row["cycle_id"], attempt_step(attempt_id)
    done = sum(1 for aid in cycle_ids if (attempt_step(aid) or 0) <= step)
    graph = build_search_graph(src.checkpointer())
    launch = next((snap for snap in graph.get_state_history(src.graph_config())
                   if (snap.values or {}).get("last_node") == "select_plans"
                   and any(c["id"] == cycle_id for c in snap.values.get("selected", []))), None)
    if launch is None:
        raise RunDirError(f"{src.path} has no checkpoint that launched cycle {cycle_id}")
    values = dict(launch.values)
    cycle = dict(next(c for c in values["selected"] if c["id"] == cycle_id))
    summary_row = attempt_summary(row)
    cycle["allowance"] = max(cycle["allowance"], done + 1)
    cycle["resume"] = {  # the cycle's state right after this attempt (launch_cycles starts the cycle from it)
        "n_attempts": done, "steps": step, "last": summary_row, "cycle_best": summary_row, "stagnation": 0,
        "feedback": f"Attempt {attempt_id} passed: score {row['score']:.4g}x vs the reference. "
                    "Improve on its code.",
    }
    values.update(selected=[cycle], last_node="select_plans")
    with _new_branch(src, into, {"attempt": attempt_id,
                                 "checkpoint": launch.config["configurable"]["checkpoint_id"]}) as new:
        store = new.store()
        try:
            store.keep_only_cycles(set(values.get("merged_cycles", [])) | {cycle_id})
            store.end_cycle_at(cycle_id, step)
            keep_to_branch(store)
            store.set_meta("status", "branched")
            store.log_event("branched", source=str(src.path), attempt=attempt_id)
        finally:
            store.close()
        _seed_state(new, values, "select_plans")
    return new


def attempt_step(attempt_id: str) -> int | None:
    """The step of a cycle's attempt id: c3.4 -> 4, and with --samples c3.4.2 (sample 2 of step 4) -> 4;
    None for anything else."""
    match = _ATTEMPT_ID.fullmatch(attempt_id)
    return int(match.group(1)) if match else None


_ATTEMPT_ID = re.compile(r"c\d+[a-z]*\.(\d+)(?:\.\d+)?")


@contextmanager
def _new_branch(src: RunDir, into: str | Path, where: dict) -> Iterator[RunDir]:
    """The branch's run directory (locked for this process), with a copy of the source's task, settings and store;
    what the block adds is part of it. Made whole or not at all (RunDir.building)."""
    with RunDir.building(into, src.path / "task", src.config.model_copy(deep=True),
                         branched_from={"run": str(Path(src.path).resolve()), **where}) as new:
        (new.path / "store.sqlite").unlink()  # the copy below replaces it (and its copy of run.json)
        copy_sqlite(src.path / "store.sqlite", new.path / "store.sqlite")
        new.save()
        yield new


def _load_edited_world_model(path: str | Path, current: dict) -> dict:
    try:
        edited = WorldModel.model_validate_json(Path(path).read_text())
    except Exception as e:
        raise RunDirError(f"{path} is not a valid world model: {e}") from None
    errors = check_invariants(WorldModel.from_state(current), edited)
    if errors:
        raise RunDirError(f"{path} breaks the world model's rules:\n  " + "\n  ".join(errors))
    return edited.to_state()


def record_preflight(run: RunDir, checked) -> None:
    """The preflight's findings into the run's record; its measurement of the seed is the run's (init_world_model
    finds it recorded and does not measure the seed again)."""
    store = run.store()
    try:
        store.log_event("preflight", slots=checked.slots, evaluated=checked.evaluated, seconds=checked.seconds)
        if checked.seed is not None and store.get_attempt("seed") is None:
            source = store.put_source(checked.files)
            row = store.record_attempt(attempt_id="seed", cycle_id="seed", node_id=ROOT, prompt_kind="seed",
                                       base_attempt_id=None, parent_attempt_id=None, source_hash=source,
                                       result=checked.seed, eval_s=checked.seed.wall_s)
            store.log_event("attempt", attempt_id="seed", cycle_id="seed", node_id=ROOT, iteration=0,
                            prompt_kind="seed", status=row["status"], score=row["score"],
                            latency_us=row["latency_us"], log="", best_score=row["score"], tokens=0)
    finally:
        store.close()


def iterations_done(run: RunDir) -> int:
    store = run.store()
    try:
        return store.count_attempts()
    finally:
        store.close()


def seed_measured(run: RunDir) -> bool:
    """Whether the run has measured its task's seed (or has none to measure)."""
    if run.task().seed_source is None:
        return True
    store = run.store()
    try:
        return store.get_attempt("seed") is not None
    finally:
        store.close()


def mark_finished(run: RunDir) -> None:
    """The checkpoint says finished; the store's status may not, where a run stopped (a full disk) between
    finalize's status write and its end: the status follows the checkpoint."""
    store = run.store()
    try:
        if store.get_meta("status") != "finished":
            store.set_meta("status", "finished")
    finally:
        store.close()


def move_endpoint(run: RunDir, base_url: str | None, model: str | None) -> bool:
    """--base-url / --model on resume: the endpoint moved, or the model name was wrong."""
    if not (base_url or model):
        return False
    for settings in (run.config.planner_llm, run.config.coder_llm):
        if settings is None:
            raise RunDirError(f"{run.path} is an offline run; --base-url/--model apply to LLM runs only")
        settings.base_url = base_url or settings.base_url
        settings.model = model or settings.model
        settings.local_model = None  # a run moved to an endpoint no longer serves its own model
    return True


def iteration_target(run: RunDir, total: int | None, more: int | None) -> int | None:
    """The new iteration budget from --iterations TOTAL or --more N; a total below what is done is an error."""
    if total is None and more is None:
        return None
    store = run.store()
    try:
        done = store.count_attempts()
    finally:
        store.close()
    if more is not None:
        return done + more
    if total < done:
        raise RunDirError(f"{run.path} has {done} iterations done; --iterations is the total budget, so at least "
                          f"{done}. For N more iterations: --more N")
    return total


def parse_answer(text: str) -> dict:
    """`approve` | `stop` | `pick ID` | `edit {"description": ...}` (also with ':' instead of the space)."""
    match = re.match(r"\s*(\w+)\s*:?\s*(.*)$", text, re.S)
    word, rest = (match.group(1).lower(), match.group(2)) if match else ("", "")
    word = {"a": "approve", "s": "stop", "p": "pick", "e": "edit"}.get(word, word)
    if word == "pick":
        return {"decision": "pick", "node_id": rest.strip()}
    if word == "edit":
        try:
            return {"decision": "edit", "action": json.loads(rest)}
        except json.JSONDecodeError as e:
            raise RunDirError(f"edit needs a JSON object of action fields, e.g. edit {{\"value\": 0.9}}: {e}") from None
    if word in ("approve", "stop"):
        return {"decision": word}
    raise RunDirError(f"unknown answer {text!r}: use approve, stop, pick ID or edit JSON")


@dataclass
class ResumePlan:
    """What ``ksearch resume`` (or any caller) asked of a run, checked against it before anything is written."""

    run: RunDir
    answer: dict | None  # to the plan-approval question the run waits on
    target: int | None  # the new iteration budget (--iterations TOTAL or --more N)
    changed: bool  # the endpoint or the sandbox moved: run.json is saved by commit_resume
    searches: bool  # something is left to do: the run is unfinished, or the budget grows

    def commit(self, preflight=None) -> bool:
        """Write what was checked: the settings, the preflight's record, the new budget. True when the budget grew
        on a finished run (it continues)."""
        if self.changed:
            self.run.save()
        if preflight is not None:
            record_preflight(self.run, preflight)
        return self.target is not None and extend(self.run, self.target)


def plan_resume(run_dir: str | Path, *, answer: str | None = None, base_url: str | None = None,
                model: str | None = None, sandbox: str | None = None, iterations: int | None = None,
                more: int | None = None) -> ResumePlan:
    """Open a run for writing and check a resume's every option against it; nothing is written yet (a refused
    option leaves the run as it was). The caller checks the pool (and the task, when its seed is not measured
    yet) while ``searches``, then ``commit``s."""
    run = RunDir.open(run_dir, writer=True)
    try:
        check_for_writing(run)
        parsed = parse_answer(answer) if answer else None
        if parsed is not None and pending_question(run) is None:
            raise RunDirError(f"{run.path} is not waiting for an answer")
        moved = move_endpoint(run, base_url, model)
        resandboxed = sandbox is not None and sandbox != run.config.sandbox
        run.config.sandbox = sandbox or run.config.sandbox
        target = iteration_target(run, iterations, more)
        searches = not is_finished(run) or (target is not None and target > iterations_done(run))
    except BaseException:
        run.lock.release()  # refused: the run is left as it was, to whoever comes next
        raise
    return ResumePlan(run, parsed, target, moved or resandboxed, searches)
