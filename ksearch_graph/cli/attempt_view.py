"""``ksearch show DIR --attempt ID``: one attempt as the search saw it, or one planner call.

For an attempt: its record (cycle, node, prompt kind, status, score, tokens), its evaluation per workload against
the reference, the baseline and the speed-of-light floor, its failure log, and the prompt(s) the coder was sent
with the raw answer. For a planner call (``init``, ``update:c3``, ``refill:c4``): every request it made, retries
included, and the raw answers. Runs from before prompts were recorded say so.
"""

from __future__ import annotations

import functools
import json

from ksearch_graph.rundir.run_dir import RunDir, RunDirError
from ksearch_graph.rundir.transcripts import keys_for_attempt, render
from ksearch_graph.search.roles.prompt_parts import performance_table
from ksearch_graph.tasks.evaluation import EvalResult
from ksearch_graph.tasks.speed_of_light import SpeedOfLight, row_fractions, run_work

NO_PROMPT = ("no prompt was recorded for it (the offline planner and coder use none; runs from before prompts were "
             "recorded keep none)")


def attempt_info(run: RunDir, attempt_id: str) -> dict:
    """What ``show --attempt --json`` prints: {"attempt", "speed_of_light", "exchanges"}; RunDirError if the run
    has neither an attempt nor a planner call of that id."""
    store = run.store()
    try:
        row = store.get_attempt(attempt_id)
        exchanges = [e for key in keys_for_attempt(attempt_id) for e in store.exchanges(key)
                     if e["key"] == key or e["key"].startswith(key + ":")]
        if row is None and not exchanges and not store.get_generation(f"{attempt_id}:0"):
            raise RunDirError(f"{run.path} has no attempt or planner call {attempt_id!r} (attempts look like c3.2; "
                              "planner calls: init, update:c3, refill:c4; see `ksearch report`)")
        work = functools.cache(lambda: run_work(store, run.task(), save=False))
        fractions = row_fractions(row, work)
        device = json.loads(row["result"]).get("environment", {}).get("gpu") if row and row["result"] else None
        return {"attempt": dict(row) if row else None,
                "speed_of_light": fractions.as_dict() if fractions else None,
                "exchanges": exchanges, "_sol": SpeedOfLight(device, work) if fractions else None}
    finally:
        store.close()


def render_attempt(run: RunDir, attempt_id: str) -> str:
    info = attempt_info(run, attempt_id)
    lines = []
    row = info["attempt"]
    if row is not None:
        tokens = f"{row['prompt_tokens'] or 0} prompt + {row['completion_tokens'] or 0} completion tokens"
        score = f", score {row['score']:.4g}x, {row['latency_us']:.4g} us" if row["status"] == "passed" and \
            row["latency_us"] else ""
        lines.append(f"attempt {row['id']}: cycle {row['cycle_id']}, node {row['node_id']}, prompt "
                     f"{row['prompt_kind']}, {row['status']}{score}; {tokens}, codegen {row['codegen_s'] or 0:.1f} s, "
                     f"evaluation {row['eval_s'] or 0:.1f} s")
        if row["result"]:
            result = EvalResult.model_validate_json(row["result"])
            table = performance_table(result, info["_sol"])
            if table:
                lines += ["", "per workload:", table]
            if result.flags:
                lines.append(f"flags: {', '.join(map(str, result.flags))}")
        if row["status"] != "passed" and row["log_excerpt"]:
            lines += ["", "log:", row["log_excerpt"].rstrip()]
    if info["exchanges"]:
        lines += [""] + [render(e) for e in info["exchanges"]]
    else:
        lines += ["", f"prompt: {NO_PROMPT}"]
    return "\n".join(lines)
