"""The run report's Markdown twin (report.md): the same sections as the HTML page, from the same facts."""

from __future__ import annotations

from ksearch_graph.reports.html import (
    ATTEMPT_COLUMNS,
    LINEAGE_COLUMNS,
    PLOT_FILE,
    TOKEN_COLUMNS,
    RunFacts,
    _lineage_rows,
    _token_rows,
    attempt_cells,
    attempts_heading,
    esc,
    fmt_latency,
    fmt_score,
    header_rows,
    last_note,
    node_facts,
    node_title,
    timing_note,
)
from ksearch_graph.search.world_model import ROOT, Node, WorldModel


def _md(text: str) -> str:
    """A table cell or inline text: escaped like the HTML (Markdown viewers render inline HTML), one line."""
    return esc(text).replace("|", "\\|").replace("\n", " ")


def _md_table(columns: list[str], rows: list[list[str]]) -> list[str]:
    return (["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
            + ["| " + " | ".join(_md(c) for c in row) + " |" for row in rows] + [""])


def render_markdown(facts: RunFacts) -> str:
    info, best = facts.info, facts.info["best"]
    lines = [f"# K-Search report: {_md(info['task'])}", ""]
    lines += [f"- **{k}**: {_md(v)}" for k, v in header_rows(facts)]
    lines.append(f"- **best attempt**: {_md(best['attempt_id'])} on node {_md(best['node_id'])}: score "
                 f"{fmt_score(best['score'])}, latency {fmt_latency(best['latency_us'])}" if best
                 else "- **best attempt**: no attempt passed")
    lines.append("")
    if note := timing_note(facts):
        lines += [f"> **Note:** {note}", ""]
    lines += ["## Tokens and cost", ""]
    lines += _md_table(TOKEN_COLUMNS, _token_rows(info["tokens"]))
    lines += ["## Best score vs iteration", "", f"![best score vs iteration]({PLOT_FILE})", ""]
    lines += ["## World model (final)", ""]
    if facts.world_model is not None:
        lines += _md_tree(facts.world_model)
    lines += ["## Lineage of the best kernel", ""]
    lines += _md_table(LINEAGE_COLUMNS, _lineage_rows(facts)) if facts.lineage else ["no best kernel", ""]
    lines += [f"## All attempts ({attempts_heading(facts)})", ""]
    lines += _md_table(ATTEMPT_COLUMNS, [attempt_cells(facts, a) for a in facts.attempts])
    lines += ["## Best kernel source", ""]
    for name, text in sorted(facts.best_files.items()):
        fence = "`" * max(3, _longest_backtick_run(text) + 1)  # a fence the source itself cannot close
        lines += [f"### {_md(name)}", "", f"{fence}python", text.rstrip("\n"), fence, ""]
    return "\n".join(lines)


def _md_tree(wm: WorldModel) -> list[str]:
    lines: list[str] = []

    def walk(node: Node, depth: int) -> None:
        indent = "  " * depth
        lines.append(f"{indent}- **{node.kind}** `{node.id}` {_md(node_title(node))} "
                     f"[{_md(' · '.join(node_facts(node)))}]")
        if note := last_note(node):
            lines.append(f"{indent}  <br>*{_md(note)}*")
        for child in wm.children(node.id):
            walk(child, depth + 1)

    walk(wm.nodes[ROOT], 0)
    return lines + [""]


def _longest_backtick_run(text: str) -> int:
    longest = run = 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    return longest
