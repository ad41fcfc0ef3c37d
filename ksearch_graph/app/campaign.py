"""A campaign: one search per task, side by side, on one shared evaluation pool and one shared token and cost budget.

    DIR/campaign.json     the tasks, the settings, the shared budget, each task's run directory
    DIR/<task>/           an ordinary run directory (``ksearch resume DIR/<task>`` continues that search alone)
    DIR/campaign.md       the report: best per task, speed-up, iterations, tokens, cost, links to each run's report

Running the same command again (or ``ksearch campaign --runs-dir DIR``) resumes every unfinished search. The shared
budget: every search may spend what the others have not; each search's own cap is moved to its spending plus what
is left of the campaign's, every second, so the searches stop together when it is gone.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from ksearch_graph.config import SearchConfig
from ksearch_graph.rundir.run_dir import RunDir, RunDirError, write_atomically
from ksearch_graph.tasks.task import Task

CAMPAIGN_FILE = "campaign.json"


@dataclass
class Campaign:
    path: Path
    runs: dict[str, str]  # task name -> run directory, relative to the campaign
    max_tokens: int | None = None
    max_cost_usd: float | None = None
    results: dict[str, dict] = field(default_factory=dict)

    @classmethod
    def open(cls, path: Path, tasks: list[Task]) -> Campaign | None:
        """The campaign in ``path``, or None when there is none; ``tasks`` (if given) must be its tasks."""
        manifest = path / CAMPAIGN_FILE
        if not manifest.is_file():
            if not tasks:
                raise RunDirError(f"{path} holds no campaign; name the tasks: ksearch campaign TASK... --runs-dir {path}")
            return None
        data = json.loads(manifest.read_text())
        campaign = cls(path, data["runs"], data.get("max_tokens"), data.get("max_cost_usd"))
        if tasks and {t.name for t in tasks} != set(campaign.runs):
            raise RunDirError(f"{path} is a campaign over {', '.join(sorted(campaign.runs))}; resume it "
                              f"without tasks (ksearch campaign --runs-dir {path}) or use another --runs-dir")
        return campaign

    @staticmethod
    def check_tasks(tasks: list[Task], config: SearchConfig) -> None:
        """Refuse, before anything is written, a campaign that could not run: a task named twice, a task the
        offline planner cannot search."""
        seen: set[str] = set()
        for task in tasks:
            if task.name in seen:
                raise RunDirError(f"task {task.name} is named twice")
            seen.add(task.name)
            if config.planner == "offline" and task.spec.template is None:
                raise RunDirError(f"task {task.name} has no kernel template, so the offline (no-LLM) planner cannot "
                                  "search it; search it with an LLM: --model M [--base-url URL]")

    @classmethod
    def create(cls, path: Path, tasks: list[Task], config: SearchConfig) -> Campaign:
        """A new campaign with one run directory per task, made whole in a hidden folder beside ``path`` and renamed
        into place: a campaign that cannot be made (a full disk) leaves nothing behind."""
        cls.check_tasks(tasks, config)
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise RunDirError(f"{path} exists and holds no campaign ({CAMPAIGN_FILE}); use another --runs-dir")
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.parent / f".{path.name}.new-{uuid.uuid4().hex[:8]}"
        staging.mkdir()
        try:
            runs: dict[str, str] = {}
            for task in tasks:
                per_run = config.model_copy(deep=True)
                per_run.budget.max_tokens = per_run.budget.max_cost_usd = None  # shared; set while running
                RunDir.create(staging / task.name, task.root, per_run)
                runs[task.name] = task.name
            campaign = cls(staging, runs, config.budget.max_tokens, config.budget.max_cost_usd)
            campaign.save()
            os.rename(staging, path)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        campaign.path = path
        return campaign

    def save(self) -> None:
        data = {"format": 1, "runs": self.runs, "max_tokens": self.max_tokens, "max_cost_usd": self.max_cost_usd}
        write_atomically(self.path / CAMPAIGN_FILE, json.dumps(data, indent=2))

    def unfinished(self) -> dict[str, RunDir]:
        from ksearch_graph.app.runs import is_finished

        todo = {name: RunDir.open(self.path / rel) for name, rel in self.runs.items()}
        return {name: run for name, run in todo.items() if not is_finished(run)}

    def check_gpu_models(self, evaluator, *, allow_gpu_change: bool = False) -> None:
        """A search measured on another GPU model than the pool's stops the campaign before any starts, unless
        ``allow_gpu_change`` (nothing is recorded here)."""
        from ksearch_graph.rundir.gpu_record import check_gpu_model

        for run in self.unfinished().values():
            store = run.store()
            try:
                check_gpu_model(store, getattr(evaluator, "model", None), run_path=run.path,
                                allow_change=allow_gpu_change, record=False)
            finally:
                store.close()

    def run(self, evaluator, *, quiet: bool = False, table_every_s: float = 10.0, allow_gpu_change: bool = False) -> int:
        """Drive every unfinished search at once on ``evaluator``; returns how many failed. A search measured on
        another GPU model than the pool's stops the campaign before any starts, unless ``allow_gpu_change``."""
        from ksearch_graph.app.runs import drive, has_started
        from ksearch_graph.search.context import make_context

        self.check_gpu_models(evaluator, allow_gpu_change=allow_gpu_change)
        todo = self.unfinished()
        contexts, threads, failures = {}, [], {}
        for name, run in todo.items():
            ctx = make_context(run, evaluator=evaluator, allow_gpu_change=allow_gpu_change)
            contexts[name] = ctx
            if ctx.gpu_note:
                print(ctx.gpu_note)

            def work(run=run, ctx=ctx, name=name):
                try:
                    drive(run, ctx, fresh=not has_started(run))
                except Exception as e:  # one search's failure must not stop the others; it stays resumable
                    failures[name] = f"{type(e).__name__}: {e}"
                    ctx.store.set_meta("status", "paused")
            threads.append(threading.Thread(target=work, name=f"campaign-{name}", daemon=True))
        # The pool is shared: a search's drive() must not close it when it ends.
        close = getattr(evaluator, "close", None)
        if close is not None:
            evaluator.close = lambda: None
        for t in threads:
            t.start()
        last_table = 0.0
        while any(t.is_alive() for t in threads):
            self._share_budget(contexts)
            if not quiet and time.monotonic() - last_table >= table_every_s:
                print(self.table(), flush=True)
                last_table = time.monotonic()
            time.sleep(1.0)
        if close is not None:
            close()
        for name, error in failures.items():
            print(f"ksearch campaign: {name} stopped: {error}\n  resume it: ksearch resume {self.path / name}",
                  file=sys.stderr)
        return len(failures)

    def _share_budget(self, contexts: dict) -> None:
        if self.max_tokens is None and self.max_cost_usd is None:
            return
        spent = {name: ctx.store.token_totals() for name, ctx in contexts.items()}
        spent_before = self._spent_by_finished(set(contexts))
        all_tokens = sum(s["total_tokens"] for s in spent.values()) + spent_before["total_tokens"]
        all_cost = sum(s["cost_usd"] for s in spent.values()) + spent_before["cost_usd"]
        for name, ctx in contexts.items():
            budget = ctx.config.budget
            if self.max_tokens is not None:
                budget.max_tokens = max(1, spent[name]["total_tokens"] + self.max_tokens - all_tokens)
            if self.max_cost_usd is not None:
                budget.max_cost_usd = max(1e-9, spent[name]["cost_usd"] + self.max_cost_usd - all_cost)

    def _spent_by_finished(self, running: set[str]) -> dict:
        total = {"total_tokens": 0, "cost_usd": 0.0}
        for name, rel in self.runs.items():
            if name in running:
                continue
            store = RunDir.open(self.path / rel, read_only=True).store()
            try:
                t = store.token_totals()
            finally:
                store.close()
            total["total_tokens"] += t["total_tokens"]
            total["cost_usd"] += t["cost_usd"]
        return total

    def rows(self) -> list[dict]:
        from ksearch_graph.reports.run_view import summary

        rows = []
        for name, rel in self.runs.items():
            info = summary(RunDir.open(self.path / rel, read_only=True))
            best = info["best"] or {}
            rows.append({"task": name, "run_dir": rel, "status": info["status"],
                         "iterations": info["iterations_done"], "budget": info["iteration_budget"],
                         "best_attempt": best.get("attempt_id"), "speedup": best.get("score"),
                         "latency_us": best.get("latency_us"), "tokens": info["tokens"]["total_tokens"],
                         "cost_usd": info["tokens"]["cost_usd"]})
        return rows

    def table(self) -> str:
        lines = [f"{'task':<40} {'status':<11} {'iter':>9} {'best':>10} {'tokens':>9} {'cost':>8}"]
        for r in self.rows():
            best = f"{r['speedup']:.4g}x" if r["speedup"] is not None else "-"
            lines.append(f"{r['task'][:40]:<40} {r['status']:<11} {r['iterations']:>4}/{r['budget']:<4} {best:>10} "
                         f"{r['tokens']:>9} ${r['cost_usd']:>7.2f}")
        return "\n".join(lines)

    def write_report(self) -> Path:
        """campaign.md: best per task, speed-up, tokens, cost, and each run's own report (written here too)."""
        from ksearch_graph.reports.report import write_report

        rows = self.rows()
        lines = ["# Campaign report", "", "| task | status | iterations | best attempt | speed-up vs reference | "
                 "latency (us) | tokens | cost | run report |", "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            write_report(self.path / r["run_dir"], None)
            link = f"{r['run_dir']}/report/report.html"
            speedup = f"{r['speedup']:.4g}x" if r["speedup"] is not None else "-"
            latency = f"{r['latency_us']:.4g}" if r["latency_us"] else "-"
            lines.append(f"| {r['task']} | {r['status']} | {r['iterations']}/{r['budget']} | "
                         f"{r['best_attempt'] or '-'} | {speedup} | {latency} | {r['tokens']} | "
                         f"${r['cost_usd']:.2f} | [{link}]({link}) |")
        lines += ["", f"Tokens, all searches: {sum(r['tokens'] for r in rows)}"
                  + (f" of {self.max_tokens}" if self.max_tokens else "")
                  + f"; cost ${sum(r['cost_usd'] for r in rows):.2f}"
                  + (f" of ${self.max_cost_usd:.2f}" if self.max_cost_usd else "") + "."]
        out = self.path / "campaign.md"
        out.write_text("\n".join(lines) + "\n")
        return out
