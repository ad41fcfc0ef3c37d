"""The run report's facts and its HTML page: one self-contained page that shows what a search did (report.py writes it,
with the Markdown twin of markdown.py).

``report.write_report(run_dir)`` reads the run directory (store, checkpoints, settings) and writes
``report.html``, ``report.md`` and ``best_score.png`` into ``run_dir/report`` (or ``out_dir``):

- a header: task, planner, status, iterations against the budget, stop reason, best attempt, tokens and cost per role,
- "best score vs iteration" as in the paper's figure, with every attempt as a dot coloured by its status and the
  action cycles drawn as bars under the plot,
- the final world-model tree, the lineage of the best kernel, a table of all attempts, the best kernel's source.

The HTML opens offline: the plot is embedded as a base64 PNG and the CSS is inline. Everything that comes from
the store may be LLM output, so every such string goes through ``html.escape`` before it reaches the page.
"""

from __future__ import annotations

import base64
import functools
import html
import io
import json
from dataclasses import dataclass

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ksearch_graph.reports.run_view import state_at, summary
from ksearch_graph.rundir.run_dir import RunDir
from ksearch_graph.search.world_model import ROOT, Node, WorldModel
from ksearch_graph.tasks.speed_of_light import fmt_percent, row_fractions, run_work, sol_summary

PLOT_FILE = "best_score.png"
esc = html.escape
NOTE_CHARS = 600  # the last planner note of a tree node is cut to this many characters

STATUS_COLORS = {
    "passed": "#2a9d4b",
    "compile_error": "#d62728",
    "runtime_error": "#ff7f0e",
    "timeout": "#9467bd",
    "incorrect_shape": "#8c564b",
    "incorrect_dtype": "#8c564b",
    "incorrect_numerical": "#bc6c25",
    "suspicious": "#e377c2",
    "unavailable": "#7f7f7f",
}
OTHER_COLOR = "#7f7f7f"


@dataclass
class RunFacts:
    """Everything the report shows, read from the run directory once."""

    info: dict  # search.summary(run)
    attempts: list[dict]  # store rows, seed first, then by iteration
    world_model: WorldModel | None
    titles: dict[str, str]  # cycle id -> the title of the action it implemented
    best_steps: list[tuple[int, float]]  # (iteration, score) of every attempt that raised the best passed score
    lineage: list[dict]  # attempt rows from the root's code to the best kernel
    best_files: dict[str, str]
    environment: dict  # the best attempt's evaluation environment
    timing_representative: bool
    tokens_per_attempt: dict[str, int]
    active_s: float
    llm_models: str  # "planner X, coder Y" for LLM runs, "" offline
    floor_fractions: dict[str, dict]  # attempt id -> speed_of_light.Fractions.as_dict(), for GPU-timed attempts


def load_facts(run: RunDir) -> RunFacts:
    info = summary(run)
    values = state_at(run)
    store = run.store()
    try:
        attempts = store.attempts()
        # Events are append-only: in a branch the copied log may name a cycle id twice; the newest is ours.
        titles = {ev["data"]["cycle_id"]: ev["data"]["title"] for ev in store.events("cycle_started")}
        best_files = store.get_source(values["best"]["source_hash"]) if values.get("best") else {}
        active_s = store.active_seconds()
        work = functools.cache(lambda: run_work(store, run.task(), save=False))
        fractions = {a["id"]: row_fractions(a, work) for a in attempts}
    finally:
        store.close()
    by_id = {a["id"]: a for a in attempts}
    best_id = info["best"]["attempt_id"] if info["best"] else None
    # The timing note is judged on the number the report puts forward: the best attempt's (else the latest).
    shown = by_id.get(best_id) or (attempts[-1] if attempts else None)
    shown_result = json.loads(shown["result"]) if shown else {}
    cfg = run.config
    return RunFacts(
        info=info,
        attempts=attempts,
        world_model=WorldModel.from_state(values["world_model"]) if values.get("world_model") else None,
        titles=titles,
        best_steps=best_steps(attempts),
        lineage=lineage(by_id, best_id),
        best_files=best_files,
        environment=shown_result.get("environment", {}),
        timing_representative=shown_result.get("timing_representative", False),
        tokens_per_attempt={a["id"]: (a["prompt_tokens"] or 0) + (a["completion_tokens"] or 0) for a in attempts},
        active_s=active_s,
        llm_models="" if cfg.planner == "offline" else f"planner {cfg.planner_llm.model}, coder {cfg.coder_llm.model}",
        floor_fractions={aid: f.as_dict() for aid, f in fractions.items() if f is not None},
    )


def best_steps(attempts: list[dict]) -> list[tuple[int, float]]:
    """(iteration, score) of every attempt that raised the best passed score: the live view's "best".

    Iterations number attempts in the order they finished, across parallel cycles, so an attempt counts from
    the moment it was measured. The search's own best (the star) is taken when cycles merge and only past the
    noise margin, so it can sit below the line's end by that margin.
    """
    steps: list[tuple[int, float]] = []
    for a in sorted(attempts, key=lambda a: a["iteration"]):
        if a["status"] == "passed" and (not steps or a["score"] > steps[-1][1]):
            steps.append((a["iteration"], a["score"]))
    return steps


def lineage(by_id: dict[str, dict], attempt_id: str | None) -> list[dict]:
    """The chain of attempts whose code led to ``attempt_id``, oldest first.

    An *improve* attempt edits the cycle's best code (``base_attempt_id``); a *first* or *debug* attempt
    starts from the previous attempt (``parent_attempt_id``, which for a first attempt is the base).
    """
    chain: list[dict] = []
    seen: set[str] = set()  # a damaged store must not loop forever
    while attempt_id in by_id and attempt_id not in seen:
        seen.add(attempt_id)
        row = by_id[attempt_id]
        chain.append(row)
        attempt_id = row["base_attempt_id"] if row["prompt_kind"] == "improve" else row["parent_attempt_id"]
    return chain[::-1]


# ---------------------------------------------------------------------------------------------- the plot


def plot_png(facts: RunFacts) -> bytes:
    buf = io.BytesIO()
    plot_figure(facts).savefig(buf, format="png")
    return buf.getvalue()


def plot_figure(facts: RunFacts) -> Figure:
    """Best score vs iteration (step line), every attempt as a dot, the action cycles as bars underneath."""
    fig = Figure(figsize=(10, 5.6), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)  # render with Agg without touching pyplot's global backend
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[4, 1.3])
    attempts = facts.attempts
    last_iteration = max((a["iteration"] for a in attempts), default=0)

    # The legend counts the search's attempts, as `ksearch show` and the header do; the seed has its own entry.
    searched = [a for a in attempts if a["prompt_kind"] != "seed"]
    for status in sorted({a["status"] for a in searched}):
        rows = [a for a in searched if a["status"] == status]
        top.scatter([a["iteration"] for a in rows], [a["score"] or 0.0 for a in rows], s=28, zorder=3,
                    color=STATUS_COLORS.get(status, OTHER_COLOR), label=f"{status} ({len(rows)})",
                    marker="o" if status == "passed" else "x")
    for seed in (a for a in attempts if a["prompt_kind"] == "seed"):
        top.scatter([seed["iteration"]], [seed["score"] or 0.0], s=40, zorder=3, marker="D",
                    color=STATUS_COLORS.get(seed["status"], OTHER_COLOR), label=f"seed ({seed['status']})")
    if facts.best_steps:
        xs = list(range(min(it for it, _ in facts.best_steps), last_iteration + 1))
        ys = [max(s for it, s in facts.best_steps if it <= x) for x in xs]
        top.step(xs, ys, where="post", color="#1f4e79", linewidth=2, label="best so far", zorder=2)
    best_id = facts.info["best"]["attempt_id"] if facts.info["best"] else None
    if best_row := next((a for a in attempts if a["id"] == best_id), None):
        top.scatter([best_row["iteration"]], [best_row["score"]], s=220, marker="*", color="#f2b705",
                    edgecolor="#1d2430", zorder=4, label=f"best ({best_id})")
    top.set_ylabel("score (speed-up vs reference)")
    top.set_title(f"{facts.info['task']}: best score vs iteration")
    top.grid(alpha=0.3)
    if attempts:
        top.legend(loc="best", fontsize=8)
    else:
        top.text(0.5, 0.5, "no attempts yet", transform=top.transAxes, ha="center", va="center")

    cycles = _cycle_spans(attempts)
    lane_ends: list[int] = []
    for cycle_id, (start, end, node_id) in cycles.items():
        # Parallel cycles interleave their iterations: give each overlapping cycle its own lane.
        lane = next((i for i, lane_end in enumerate(lane_ends) if lane_end < start), len(lane_ends))
        lane_ends[lane:lane + 1] = [end]
        bottom.barh(lane, end - start + 0.8, left=start - 0.4, height=0.7, color="#a8c5e0", edgecolor="#1f4e79")
        bottom.text((start + end) / 2, lane, f"{cycle_id} {node_id}", ha="center", va="center", fontsize=8)
        top.axvline(start - 0.5, color="#999999", linewidth=0.6, linestyle=":", zorder=1)
    bottom.set_yticks([])
    bottom.set_ylim(max(len(lane_ends), 1) - 0.5, -0.5)
    bottom.set_ylabel("cycles")
    bottom.set_xlabel("iteration (0 = seed)")
    bottom.set_xlim(-0.7, last_iteration + 0.7)
    return fig


def _cycle_spans(attempts: list[dict]) -> dict[str, tuple[int, int, str]]:
    """cycle id -> (first iteration, last iteration, node id), for the search's cycles (not the seed)."""
    spans: dict[str, tuple[int, int, str]] = {}
    for a in attempts:
        if a["prompt_kind"] == "seed":
            continue
        start, end, _ = spans.get(a["cycle_id"], (a["iteration"], a["iteration"], a["node_id"]))
        spans[a["cycle_id"]] = (min(start, a["iteration"]), max(end, a["iteration"]), a["node_id"])
    return spans


# ---------------------------------------------------------------------------------------------- formatting


def fmt_score(score: float | None) -> str:
    return "–" if score is None else f"{score:.4g}x"


def attempt_score(a: dict) -> str:
    """A failed attempt has no score (its stored 0 is no speed-up)."""
    return fmt_score(a["score"]) if a["status"] == "passed" else "–"


def fmt_latency(us: float | None) -> str:
    if us is None:
        return "–"
    return f"{us:.4g} µs" if us < 1000 else f"{us / 1000:.4g} ms"


def log_headline(text: str | None) -> str:
    """The line of a failure log worth a table cell: the first that is not a traceback header or frame.

    Evaluation logs lead with the candidate's last frames (indented) and end with the exception itself.
    """
    lines = [line for line in (text or "").splitlines() if line.strip()]
    message = (line for line in lines if not line[0].isspace() and not line.startswith("Traceback"))
    return next(message, lines[0] if lines else "").strip()


def action_title(facts: RunFacts, row: dict) -> str:
    if row["prompt_kind"] == "seed":
        return "(seed solution)"
    if row["cycle_id"] in facts.titles:
        return facts.titles[row["cycle_id"]]
    node = facts.world_model.nodes.get(row["node_id"]) if facts.world_model else None
    return node.action.title if node and node.action else ""


def timing_note(facts: RunFacts) -> str:
    if facts.timing_representative or not facts.environment:
        return ""
    env = facts.environment
    where = "the Triton CPU interpreter" if env.get("triton_interpret") else f"device {env.get('device', '?')}"
    return (f"Timings were measured with {where}: they rank candidates against each other but say nothing "
            "about GPU performance. Re-evaluate the exported kernel on a GPU for real numbers.")


def header_rows(facts: RunFacts) -> list[tuple[str, str]]:
    """(label, text) pairs of the report's header; plain text, escaped by each writer."""
    info = facts.info
    rows = [
        ("task", info["task"]),
        ("planner", info["planner"] + (f" ({facts.llm_models})" if facts.llm_models else "")),
        ("status", info["status"]),
        ("iterations", f"{info['iterations_done']} / {info['iteration_budget']}"
                       f" ({info['passed']} of {info['attempts']} attempts passed)"),
        ("stop reason", info["stop_reason"] or "–"),
        ("search time", f"{facts.active_s:.1f} s (code generation + evaluation)"),
        ("total tokens", f"{info['tokens']['total_tokens']} (cost ${info['tokens']['cost_usd']:.4f})"),
    ]
    if info["best"] and info["best"].get("speed_of_light"):
        rows.append(("speed of light", "best attempt: " + sol_summary(info["best"]["speed_of_light"])))
    if info["gpu_models"]:
        rows.append(("GPU model", gpu_models_text(info["gpu_models"])))
    if info["branched_from"]:
        rows.append(("branched from", f"{info['branched_from']['run']} at {info['branched_from']['checkpoint']}"))
    return rows


def gpu_models_text(models: list[dict]) -> str:
    """``cpu``, or for a run resumed with --allow-gpu-change: each model from the iteration it began at."""
    if len(models) == 1:
        return models[0]["model"]
    parts = "; ".join(f"{m['model']} from iteration {m['from_iteration']}" for m in models)
    return f"{parts} (changed with --allow-gpu-change: scores measured on different models do not compare)"


def node_facts(node: Node) -> list[str]:
    """The numbers shown for a world-model node, as short "name value" strings."""
    out = []
    if node.action:
        out += [f"V {node.action.value:.2f}", f"difficulty {node.action.difficulty}"]
    out.append(f"rating {node.beliefs.rating:.2f}")
    if node.visits:
        out.append(f"visits {node.visits}, failed {node.failures}")
    if node.attachment:
        out.append(f"attempt {node.attachment.attempt_id} {fmt_score(node.attachment.score)}")
    return out


def last_note(node: Node) -> str:
    note = node.beliefs.notes[-1] if node.beliefs.notes else ""
    return note if len(note) <= NOTE_CHARS else note[:NOTE_CHARS] + " …"


def node_title(node: Node) -> str:
    return node.action.title if node.action else "(task)"


def attempts_heading(facts: RunFacts) -> str:
    """The count `ksearch show` prints (the search's attempts), and the seed named apart: "12, and the seed"."""
    seed = any(a["prompt_kind"] == "seed" for a in facts.attempts)
    return f"{facts.info['attempts']}" + (", and the seed" if seed else "")


ATTEMPT_COLUMNS = ["iter", "attempt", "cycle", "node", "prompt", "status", "score", "latency", "of floor", "tokens",
                   "eval s", "error (failures) / flags (passed)"]


def attempt_flags(a: dict) -> str:
    """A passed attempt's flags (things worth a second look, e.g. added_input_keys), from its stored result."""
    try:
        flags = json.loads(a.get("result") or "{}").get("flags") or []
    except ValueError:
        return ""
    return "flags: " + ", ".join(map(str, flags)) if flags else ""


def floor_cell(facts: RunFacts, attempt_id: str) -> str:
    """The attempt's fraction of the speed-of-light floor; "!" marks one faster than the floor (implausible)."""
    fr = facts.floor_fractions.get(attempt_id)
    if fr is None:
        return "–"
    return fmt_percent(fr["fraction"]) + (" !" if fr["implausible"] else "")


def attempt_cells(facts: RunFacts, a: dict) -> list[str]:
    flags = attempt_flags(a)
    fr = facts.floor_fractions.get(a["id"])
    if fr and fr["implausible"]:
        flags = (flags + "; " if flags else "") + "faster than the floor on " + ", ".join(fr["implausible"])
    return [str(a["iteration"]), a["id"], a["cycle_id"], a["node_id"], a["prompt_kind"], a["status"],
            attempt_score(a), fmt_latency(a["latency_us"]), floor_cell(facts, a["id"]),
            str(facts.tokens_per_attempt[a["id"]]), f"{a['eval_s'] or 0:.1f}",
            flags if a["status"] == "passed" else log_headline(a["log_excerpt"])]


# ---------------------------------------------------------------------------------------------- HTML

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 0; background: #f6f7f9; color: #1d2430; }
main { max-width: 1250px; margin: 0 auto; padding: 24px; }
h1 { margin-top: 0; } h2 { border-bottom: 1px solid #d5d9e0; padding-bottom: 4px; margin-top: 32px; }
table { border-collapse: collapse; background: #fff; }
th, td { border: 1px solid #d5d9e0; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #eef1f5; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.kv th { width: 11em; }
tr.best td { background: #e4f4e8; font-weight: 600; }
.warn { background: #fff4d6; border: 1px solid #e0c060; padding: 8px 12px; border-radius: 4px; }
img.plot { max-width: 100%; background: #fff; border: 1px solid #d5d9e0; }
ul.tree, ul.tree ul { list-style: none; padding-left: 22px; border-left: 1px dotted #b0b8c4; }
ul.tree { padding-left: 4px; border: none; }
ul.tree li { margin: 4px 0; }
.kind { display: inline-block; min-width: 5.5em; font-size: 12px; padding: 0 6px; border-radius: 3px; color: #fff; }
.kind-root { background: #1f4e79; } .kind-closed { background: #2a9d4b; }
.kind-open { background: #6c7a89; } .kind-decision { background: #bc6c25; }
.facts { color: #4a5563; font-size: 13px; }
.note { white-space: pre-wrap; font-size: 12px; color: #4a5563; margin: 2px 0 0 0; }
pre.source { background: #fff; border: 1px solid #d5d9e0; padding: 12px; overflow-x: auto; font-size: 12.5px; }
td.log { font-family: monospace; font-size: 12px; max-width: 380px; overflow-wrap: anywhere; }
"""


def render_html(facts: RunFacts, png: bytes) -> str:
    info, best = facts.info, facts.info["best"]
    parts = [f"<h1>K-Search report: {esc(info['task'])}</h1>", '<section id="summary"><table class="kv">']
    parts += [f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in header_rows(facts)]
    if best:
        parts.append(
            f'<tr><th>best attempt</th><td><span id="best-attempt">{esc(best["attempt_id"])}</span> on node '
            f'{esc(best["node_id"])}: score <span id="best-score" data-value="{best["score"]!r}">'
            f'{esc(fmt_score(best["score"]))}</span>, latency {esc(fmt_latency(best["latency_us"]))}</td></tr>')
    else:
        parts.append("<tr><th>best attempt</th><td>no attempt passed</td></tr>")
    parts.append("</table></section>")
    if note := timing_note(facts):
        parts.append(f'<p class="warn" id="timing-note">{esc(note)}</p>')
    parts.append(_html_tokens(facts))
    parts.append('<section id="progress"><h2>Best score vs iteration</h2>'
                 f'<img class="plot" alt="best score vs iteration" '
                 f'src="data:image/png;base64,{base64.b64encode(png).decode()}"></section>')
    parts.append(_html_tree(facts))
    parts.append(_html_lineage(facts))
    parts.append(_html_attempts(facts))
    parts.append(_html_source(facts))
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<title>K-Search report: {esc(info["task"])}</title><style>{CSS}</style></head>\n'
            '<body><main>\n' + "\n".join(parts) + "\n</main></body></html>\n")


def _table(columns: list[str], rows: list[list[str]], *, table_id: str, row_classes: list[str] | None = None,
           col_classes: dict[int, str] | None = None) -> str:
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        cells = "".join(f'<td class="{col_classes[j]}">{esc(c)}</td>' if col_classes and j in col_classes
                        else f"<td>{esc(c)}</td>" for j, c in enumerate(row))
        body.append(f"<tr{cls}>{cells}</tr>")
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _numeric(*columns: int) -> dict[int, str]:
    return dict.fromkeys(columns, "num")


def _html_tokens(facts: RunFacts) -> str:
    tokens = facts.info["tokens"]
    rows = _token_rows(tokens)
    return ('<section id="tokens"><h2>Tokens and cost</h2>'
            f'<p>total <span id="total-tokens" data-value="{tokens["total_tokens"]}">{tokens["total_tokens"]}</span>'
            f' tokens, ${tokens["cost_usd"]:.4f}</p>'
            + _table(TOKEN_COLUMNS, rows, table_id="tokens-table", col_classes=_numeric(1, 2, 3, 4, 5)) + "</section>")


TOKEN_COLUMNS = ["role", "calls", "prompt tokens", "of them cached", "completion tokens", "cost"]


def _token_rows(tokens: dict) -> list[list[str]]:
    return [[role, str(v["calls"]), str(v["prompt_tokens"]), str(v.get("cached_prompt_tokens", 0)),
             str(v["completion_tokens"]), f"${v['cost_usd']:.4f}"] for role, v in sorted(tokens["per_role"].items())]


def _html_tree(facts: RunFacts) -> str:
    wm = facts.world_model
    if wm is None:
        return '<section id="world-model"><h2>World model</h2><p>no world model yet</p></section>'

    def item(node: Node) -> str:
        note = last_note(node)
        children = wm.children(node.id)
        return (f'<li><span class="kind kind-{node.kind}">{node.kind}</span> <b>{esc(node.id)}</b> '
                f'{esc(node_title(node))} <span class="facts">[{esc(" · ".join(node_facts(node)))}]</span>'
                + (f'<div class="note">{esc(note)}</div>' if note else "")
                + (f"<ul>{''.join(item(c) for c in children)}</ul>" if children else "") + "</li>")

    return (f'<section id="world-model"><h2>World model (final, {len(wm.nodes)} nodes)</h2>'
            f'<ul class="tree">{item(wm.nodes[ROOT])}</ul></section>')


def _lineage_rows(facts: RunFacts) -> list[list[str]]:
    return [[str(i), a["id"], a["cycle_id"], a["node_id"], action_title(facts, a), a["prompt_kind"], a["status"],
             attempt_score(a)] for i, a in enumerate(facts.lineage)]


LINEAGE_COLUMNS = ["step", "attempt", "cycle", "node", "action", "prompt", "status", "score"]


def _html_lineage(facts: RunFacts) -> str:
    if not facts.lineage:
        return '<section id="lineage"><h2>Lineage of the best kernel</h2><p>no best kernel</p></section>'
    return ('<section id="lineage"><h2>Lineage of the best kernel</h2>'
            + _table(LINEAGE_COLUMNS, _lineage_rows(facts), table_id="lineage-table", col_classes=_numeric(0, 7)) + "</section>")


def _html_attempts(facts: RunFacts) -> str:
    best_id = facts.info["best"]["attempt_id"] if facts.info["best"] else None
    rows = [attempt_cells(facts, a) for a in facts.attempts]
    classes = ["best" if a["id"] == best_id else "" for a in facts.attempts]
    # The last column holds compiler and traceback text: a monospace cell reads better.
    table = _table(ATTEMPT_COLUMNS, rows, table_id="attempts-table", row_classes=classes,
                   col_classes={**_numeric(0, 6, 7, 8, 9, 10), 11: "log"})
    return f'<section id="attempts"><h2>All attempts ({attempts_heading(facts)})</h2>{table}</section>'


def _html_source(facts: RunFacts) -> str:
    if not facts.best_files:
        return '<section id="source"><h2>Best kernel source</h2><p>no best kernel</p></section>'
    files = "".join(f'<h3>{esc(name)}</h3><pre class="source"><code>{esc(text)}</code></pre>'
                    for name, text in sorted(facts.best_files.items()))
    return f'<section id="source"><h2>Best kernel source</h2>{files}</section>'


# ---------------------------------------------------------------------------------------------- Markdown


# ---------------------------------------------------------------------------------------------- entry point


