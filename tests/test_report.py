"""The run report and the kernel export, checked against a real offline run.

The HTML is parsed with the standard library's parser: tags must balance, nothing may be fetched from the
network, the plot must be embedded, and the numbers on the page must be the store's. A headless Chromium
(if installed) renders the page to a screenshot.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import SOFTMAX, run_cli

from ksearch_graph.reports.export import export_best
from ksearch_graph.reports.html import PLOT_FILE, load_facts, plot_figure
from ksearch_graph.reports.report import write_report
from ksearch_graph.reports.run_view import summary
from ksearch_graph.rundir.run_dir import RunDir

pytestmark = pytest.mark.slow  # its fixture runs a search

CHROMIUM = Path("/usr/bin/chromium")
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class PageParser(HTMLParser):
    """Checks that tags nest properly and collects what the tests look at."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.attr_values: list[str] = []
        self.images: list[str] = []
        self.by_id: dict[str, dict] = {}  # element id -> {"attrs": ..., "text": ...}
        self.table_rows: dict[str, list[list[str]]] = {}  # table id -> body rows (cell texts)
        self.style = ""
        self._open_ids: list[tuple[int, str]] = []  # (stack depth, id) of elements whose text is collected
        self._table: str | None = None
        self._in_body = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.attr_values += [v for v in attrs.values() if v]
        if tag == "img":
            self.images.append(attrs.get("src", ""))
        if tag in VOID:
            return
        self.stack.append(tag)
        if "id" in attrs:
            self.by_id[attrs["id"]] = {"attrs": attrs, "text": ""}
            self._open_ids.append((len(self.stack), attrs["id"]))
        if tag == "table":
            self._table = attrs.get("id")
            self.table_rows[self._table] = []
        elif tag == "tbody":
            self._in_body = True
        elif tag == "tr" and self._in_body:
            self.table_rows[self._table].append([])
        elif tag == "td" and self._in_body:
            self.table_rows[self._table][-1].append("")

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1] if self.stack else 'nothing'}")
            return
        if self._open_ids and self._open_ids[-1][0] == len(self.stack):
            self._open_ids.pop()
        self.stack.pop()
        if tag == "tbody":
            self._in_body = False

    def handle_data(self, data):
        if self.stack and self.stack[-1] == "style":
            self.style += data
        for _, element_id in self._open_ids:
            self.by_id[element_id]["text"] += data
        if self._in_body and self.stack and self.stack[-1] == "td":
            self.table_rows[self._table][-1][-1] += data


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("report") / "run"
    run_cli("run", str(SOFTMAX), "--run-dir", str(path), "--iterations", "4", "--stagnation-window", "2",
            "--quiet", check=True)
    return path


@pytest.fixture(scope="module")
def report(run_dir, tmp_path_factory) -> dict[str, Path]:
    return write_report(run_dir, tmp_path_factory.mktemp("out"))


def _parse(path: Path) -> PageParser:
    parser = PageParser()
    parser.feed(path.read_text(encoding="utf-8"))
    parser.close()
    return parser


def _store_rows(run_dir: Path, sql: str) -> list[sqlite3.Row]:
    with sqlite3.connect(run_dir / "store.sqlite") as db:
        db.row_factory = sqlite3.Row
        return db.execute(sql).fetchall()


def test_html_is_well_formed_offline_and_embeds_the_plot(report):
    page = _parse(report["html"])
    assert page.errors == [] and page.stack == []
    assert not [v for v in page.attr_values if "http://" in v or "https://" in v]
    assert "http" not in page.style and "@import" not in page.style
    assert len(page.images) == 1 and page.images[0].startswith("data:image/png;base64,")
    assert {"summary", "progress", "world-model", "lineage", "attempts", "source", "tokens"} <= set(page.by_id)
    assert report["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_html_numbers_match_the_store(run_dir, report):
    page = _parse(report["html"])
    info = summary(RunDir.open(run_dir))
    attempts = _store_rows(run_dir, "select id, status from attempts order by iteration")
    rows = page.table_rows["attempts-table"]
    assert len(rows) == len(attempts) == info["attempts"] + 1  # the seed is measured too
    assert [r[1] for r in rows] == [a["id"] for a in attempts]
    assert [r[5] for r in rows] == [a["status"] for a in attempts]
    assert page.by_id["best-attempt"]["text"] == info["best"]["attempt_id"]
    assert float(page.by_id["best-score"]["attrs"]["data-value"]) == info["best"]["score"]
    assert int(page.by_id["total-tokens"]["attrs"]["data-value"]) == info["tokens"]["total_tokens"]
    assert page.by_id["total-tokens"]["text"] == str(info["tokens"]["total_tokens"])
    lineage = page.table_rows["lineage-table"]
    assert lineage[-1][1] == info["best"]["attempt_id"]
    assert lineage[0][1] == "seed"  # the offline example has a seed: every kernel descends from it
    assert "Triton CPU interpreter" in page.by_id["timing-note"]["text"]  # CPU timings say so


def test_markdown_references_the_plot(report):
    text = report["markdown"].read_text(encoding="utf-8")
    assert f"]({PLOT_FILE})" in text and (report["markdown"].parent / PLOT_FILE).is_file()
    assert "## All attempts" in text and "## Lineage of the best kernel" in text


def test_store_text_is_escaped(run_dir, tmp_path):
    """Logs and notes may be LLM output: markup in them must show as text, not become part of the page."""
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    with sqlite3.connect(copy / "store.sqlite") as db:
        db.execute("update attempts set status = 'compile_error', log_excerpt = ? where id = ?",
                   ["<script>alert(1)</script> error </td></tr></table>", "c1.1"])
    html_path = write_report(copy)["html"]
    page = _parse(html_path)
    assert page.errors == [] and page.stack == []
    text = html_path.read_text(encoding="utf-8")
    assert "<script>" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    row = next(r for r in page.table_rows["attempts-table"] if r[1] == "c1.1")
    assert row[-1].startswith("<script>")  # the first line of the log, shown as text


def test_export_best_writes_the_stored_source(run_dir, tmp_path):
    info = summary(RunDir.open(run_dir))
    sources = {r["id"]: json.loads(r["files"]) for r in _store_rows(
        run_dir, "select a.id, s.files from attempts a join sources s on s.hash = a.source_hash")}

    [folder] = export_best(run_dir, tmp_path / "best")
    files = sources[info["best"]["attempt_id"]]
    assert sorted(p.name for p in folder.iterdir()) == sorted([*files, "result.json"])
    for name, text in files.items():
        assert (folder / name).read_bytes() == text.encode()
    result = json.loads((folder / "result.json").read_text())
    assert result["attempt_id"] == info["best"]["attempt_id"] and result["score"] == info["best"]["score"]
    assert result["task"] == "softmax" and result["workloads"] and result["environment"]

    folders = export_best(run_dir, tmp_path / "top", top=3)
    assert folders[0].name == info["best"]["attempt_id"] and 1 <= len(folders) <= 3
    assert len({tuple(sorted(sources[f.name].items())) for f in folders}) == len(folders)  # distinct code
    for f in folders:
        assert json.loads((f / "result.json").read_text())["attempt_id"] == f.name


def _slow_seed_task(folder: Path) -> Path:
    """The softmax example with a seed that repeats its launch 50 times: the search's kernels beat it."""
    shutil.copytree(SOFTMAX, folder)
    seed = folder / "seed.py"
    launch = "    _softmax_row[(rows,)]("
    assert launch in seed.read_text()
    seed.write_text(seed.read_text().replace(launch, "    for _ in range(50):\n    " + launch))
    return folder


@pytest.mark.slow
def test_best_so_far_line_follows_finished_attempts_with_parallel_cycles(tmp_path):
    """With -k 2 the cycles merge only at the end; the plot's best-so-far line must still rise at the attempt
    that beat the seed, in the order attempts finished, as the live view printed it."""
    run_dir = tmp_path / "run"
    proc = run_cli("run", str(_slow_seed_task(tmp_path / "task")), "--offline", "-k", "2", "--iterations", "4",
                   "--run-dir", str(run_dir), check=True)
    rows = _store_rows(run_dir, "select id, iteration, status, score from attempts order by iteration")
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3, 4] and {r["id"][:2] for r in rows[1:]} == {"c1", "c2"}

    line = next(ln for ln in plot_figure(load_facts(RunDir.open(run_dir))).axes[0].get_lines()
                if ln.get_label() == "best so far")
    expected = [max(r["score"] for r in rows[:i + 1] if r["status"] == "passed") for i in range(len(rows))]
    assert list(line.get_xdata()) == [0, 1, 2, 3, 4]
    assert list(line.get_ydata()) == expected
    seed_score = rows[0]["score"]
    first_better = next(r for r in rows if r["status"] == "passed" and r["score"] > seed_score)
    assert first_better["iteration"] < 4  # the case that went wrong: a new best before the cycles merged
    assert f"best {first_better['score']:.4g}x ({first_better['id']})" in proc.stdout  # the live view agrees


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (/usr/bin/chromium) for the screenshot")
def test_headless_browser_screenshot(report, tmp_path):
    shot = tmp_path / "report.png"
    subprocess.run([str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1400,2000",
                    report["html"].resolve().as_uri()], capture_output=True, timeout=120, check=True)
    from PIL import Image  # installed with matplotlib

    with Image.open(shot) as img:
        assert img.size == (1400, 2000)
        # A blank or error page has a handful of colours; the report has text, tables and the plot.
        assert len(img.convert("RGB").getcolors(maxcolors=1 << 20)) > 200
    if artifacts := os.environ.get("KSEARCH_TEST_ARTIFACTS"):  # CI uploads this folder
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(artifacts) / "report_screenshot.png")


@pytest.mark.slow
def test_counts_and_scores_agree_across_show_the_report_and_the_plot(tmp_path):
    """One run, one count: `show`, the report's header and table, and the plot's legend all count the search's
    attempts (the seed named apart); a failed attempt shows no score, and the live view counts in the singular."""
    run_dir = tmp_path / "run"
    proc = run_cli("run", str(SOFTMAX), "--offline", "-k", "2", "--iterations", "3", "--stagnation-window", "3",
                   "--run-dir", str(run_dir), check=True)
    assert "(up to 1 attempt)" in proc.stdout and "closed after 1 attempt:" in proc.stdout, proc.stdout
    assert "1 attempts" not in proc.stdout
    rows = _store_rows(run_dir, "select id, status, prompt_kind from attempts order by iteration")
    failed = [r["id"] for r in rows if r["status"] != "passed"]
    assert failed, "the example's run has a failing attempt (c2.1, a single block too small for its rows)"

    shown = run_cli("show", str(run_dir), check=True).stdout
    assert "attempts 3 (" in shown and "0x" not in shown
    paths = write_report(run_dir, tmp_path / "out")
    page = _parse(paths["html"])
    assert "(3, and the seed)" in page.by_id["attempts"]["text"]
    assert "## All attempts (3, and the seed)" in paths["markdown"].read_text(encoding="utf-8")
    header = next(r for r in page.table_rows.get("attempts-table", []) if r[1] == failed[0])
    assert header[6] == "–"  # no "0x" for a failed attempt
    assert "0x" not in paths["markdown"].read_text(encoding="utf-8").split("## All attempts")[1].split("##")[0]

    legend = plot_figure(load_facts(RunDir.open(run_dir, read_only=True))).axes[0].get_legend()
    labels = [t.get_text() for t in legend.get_texts()]
    counted = sum(int(label.rsplit("(", 1)[1].rstrip(")")) for label in labels
                  if not label.startswith(("seed", "best")) and label.rsplit("(", 1)[1].rstrip(")").isdigit())
    assert counted == 3 and any(label.startswith("seed (") for label in labels), labels
