"""The live CLI view: one line per event, from the graph's custom stream.

Plain lines (not a redrawn screen) so the same view works in a terminal, a log file and CI.
Every attempt line carries the budget, the attempt's status, the best score so far and the tokens spent, and with GPU
timings the fraction of the speed-of-light floor it reached (flagged when faster than the floor).
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

from ksearch_graph.rundir.store import RunStore
from ksearch_graph.tasks.evaluation import error_headline


def show_llm_heartbeats(out: TextIO = sys.stdout) -> None:
    """Print the LLM layer's "still waiting" lines (llm.HEARTBEAT_LOG) with the live view."""
    import logging

    from ksearch_graph.llm.client import HEARTBEAT_LOG

    if not HEARTBEAT_LOG.handlers:
        handler = logging.StreamHandler(out)
        handler.setFormatter(logging.Formatter("%(message)s"))
        HEARTBEAT_LOG.addHandler(handler)
        HEARTBEAT_LOG.setLevel(logging.INFO)
        HEARTBEAT_LOG.propagate = False


class ProgressPrinter:
    def __init__(self, store: RunStore, budget: int, out: TextIO = sys.stdout):
        self.store = store
        self.budget = budget
        self.out = out
        # A resumed run starts from the best it already has.
        passed = [a for a in store.attempts() if a["status"] == "passed"]
        top = max(passed, key=lambda a: a["score"], default=None)
        self.best: tuple[float, str] | None = (top["score"], top["id"]) if top else None
        self.titles: dict[str, str] = {}

    def _print(self, text: str) -> None:
        try:
            print(text, file=self.out, flush=True)
        except BrokenPipeError:  # `ksearch run ... | head`: the search goes on without a view
            self.out = open(os.devnull, "w")

    def __call__(self, event: dict) -> None:
        kind = event.get("event")
        if kind == "world_model":
            self._print(f"[world model] {event['phase']}: {event['nodes']} nodes, {event['frontier']} open actions on the frontier")
        elif kind == "cycle_started":
            self.titles[event["cycle_id"]] = event["title"]
            self._print(f"[cycle {event['cycle_id']}] {event['node_id']}: {event['title']} "
                        f"(up to {plural(event['allowance'], 'attempt')})")
        elif kind == "attempt":
            self._attempt(event)
        elif kind == "cycle_finished":
            outcome = f"best {event['best_attempt']}" if event["passed"] else "nothing passed"
            self._print(f"[cycle {event['cycle_id']}] closed after {plural(event['attempts'], 'attempt')}: {outcome}; "
                        f"{event['reason']}")
        elif kind == "infrastructure":
            where = f" on {event['slot']}" if event.get("slot") else ""
            self._print(f"[infrastructure] {event['attempt_id']}: {event['reason']}{where}: not the candidate's "
                        f"failure, not counted (evaluation {event['try_number']} of {event['tries']})")
        elif kind == "new_best":
            self._print(f"[best] {event['attempt_id']}: score {event['score']:.4g}x")
        elif kind in ("edit_rejected", "planner_failed"):
            self._print(f"[planner] edit rejected after retries: {'; '.join(event['errors'])[:300]}")
        elif kind == "stopping":
            self._print(f"[stop] {event['reason']}")

    def _attempt(self, e: dict) -> None:
        if e["status"] == "passed" and (self.best is None or e["score"] > self.best[0]):
            self.best = (e["score"], e["attempt_id"])
        tokens = self.store.token_totals()
        best = f"{self.best[0]:.4g}x ({self.best[1]})" if self.best else "-"
        score = f"{e['score']:.4g}x" if e["status"] == "passed" else ""
        where = "seed" if e["prompt_kind"] == "seed" else f"{e['iteration']:>3}/{self.budget}"
        cost = f" ${tokens['cost_usd']:.3f}" if tokens["cost_usd"] else ""
        floor = f" ({100 * e['floor_fraction']:.3g}% of floor)" if e.get("floor_fraction") else ""
        if e.get("implausible"):
            floor += " IMPLAUSIBLE: faster than the floor"
        line = (f"[{where}] {e['attempt_id']:<7} {e['prompt_kind']:<7} {e['status']:<20} {score:<9}{floor} "
                f"| best {best} | tokens {tokens['total_tokens']}{cost}")
        self._print(line)
        if e["status"] != "passed":
            row = self.store.get_attempt(e["attempt_id"])
            headline = error_headline(row["log_excerpt"] if row else e.get("log", ""))
            if headline:
                self._print("          " + headline[:200])


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"
