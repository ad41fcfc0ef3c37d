"""``ksearch report DIR``: the run report, one self-contained HTML page (html.py), its Markdown twin (markdown.py)
and the best-score plot, written into DIR/report/."""

from __future__ import annotations

from pathlib import Path

from ksearch_graph.reports.html import PLOT_FILE, load_facts, plot_png, render_html
from ksearch_graph.reports.markdown import render_markdown
from ksearch_graph.rundir.integrity import open_for_reading


def write_report(run_dir: str | Path, out_dir: str | Path | None = None) -> dict[str, Path]:
    """Write report.html, report.md and the plot. Returns their paths under the keys html, markdown, plot."""
    run = open_for_reading(run_dir)
    out = Path(out_dir) if out_dir is not None else run.path / "report"
    out.mkdir(parents=True, exist_ok=True)
    facts = load_facts(run)
    png = plot_png(facts)
    paths = {"html": out / "report.html", "markdown": out / "report.md", "plot": out / PLOT_FILE}
    paths["plot"].write_bytes(png)
    paths["html"].write_text(render_html(facts, png), encoding="utf-8")
    paths["markdown"].write_text(render_markdown(facts), encoding="utf-8")
    return paths
