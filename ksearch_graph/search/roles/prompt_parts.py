"""The parts the LLM prompts are made of (llm_agents.py puts them together).

Every prompt starts with the same **task block**: the spec, the reference, the GPU and the workloads' floors, and
the planner's analysis of the task. It changes nothing from call to call of a run, so it forms, after the role's
system prompt, the prefix a provider's prompt cache can reuse; what changes (the tree, the code, the evidence) comes
after it.
"""

from __future__ import annotations

import difflib
import re

from ksearch_graph.tasks.evaluation import EvalResult
from ksearch_graph.tasks.speed_of_light import SpeedOfLight, Work, fmt_bytes, fmt_flops, fmt_percent
from ksearch_graph.tasks.task import Task

_HEADING = re.compile(r"^#{1,6} ", re.MULTILINE)
HISTORY_ATTEMPTS = 4  # earlier attempts of the cycle the coder sees (besides the last one, shown whole)
HISTORY_DIFF_LINES = 60  # of one attempt's change


def compact_spec(text: str, limit: int) -> str:
    """The spec in at most ``limit`` characters with every section kept: each heading, then the start of its text,
    the room shared evenly. The whole spec when it fits."""
    if len(text) <= limit:
        return text
    starts = [m.start() for m in _HEADING.finditer(text)]
    if not starts or starts[0] != 0:
        starts = [0] + starts
    sections = [text[a:b].rstrip("\n") for a, b in zip(starts, starts[1:] + [len(text)])]
    marker = " [...]"
    share = max(0, limit // len(sections) - 1)
    out = []
    for section in sections:
        heading, _, body = section.partition("\n")
        if len(section) <= share:
            out.append(section)
        elif len(heading) + len(marker) >= share:
            out.append(heading[: max(0, share)])
        else:
            out.append(heading + "\n" + body[: share - len(heading) - len(marker) - 1].rstrip() + marker)
    return "\n".join(out)[:limit]


def headline(log: str | None) -> str:
    """The line of a failure log that says what went wrong: the first that is not a traceback header or frame."""
    lines = [line for line in (log or "").splitlines() if line.strip()]
    message = (line for line in lines if not line[0].isspace() and not line.startswith("Traceback"))
    return next(message, lines[0] if lines else "").strip()[:300]


# ------------------------------------------------------------------------------------------------ the task block


def task_block(task: Task, *, spec: str, reference: str, sol: SpeedOfLight | None, seed: str = "",
               analysis: str = "") -> str:
    """The stable head of every prompt of a run: task, reference, GPU and floors, (for the planner) the seed,
    analysis."""
    parts = [f"# Task: {task.name} ({task.spec.language})\n{spec.rstrip()}\n",
             "# Reference implementation (correct, slow; the score is its latency divided by yours)\n"
             f"```python\n{reference.rstrip()}\n```\n"]
    if sol is not None:
        parts.append(gpu_section(task, sol))
    if seed:
        parts.append(seed)
    if analysis:
        parts.append(f"# The planner's analysis of the task (written at initialisation)\n{analysis.rstrip()}\n")
    return "\n".join(parts)


def gpu_section(task: Task, sol: SpeedOfLight) -> str:
    gpu = sol.gpu
    if not sol.device or sol.device == "cpu":
        # Triton's autotuner benchmarks through a GPU driver, which the interpreter has not: every call of an
        # autotuned kernel fails there ("0 active drivers").
        where = ("no GPU: candidates run in Triton's CPU interpreter, so timings rank candidates but are not GPU "
                 "numbers, and there is no floor; @triton.autotune fails there (it needs a GPU driver): pass one "
                 "fixed config")
    elif gpu is None:
        where = f"{sol.device} (not in ksearch's table of GPU peaks: no floor)"
    else:
        where = f"{sol.device} = {gpu.describe()}"
    lines = ["# GPU and speed of light", f"Timed on: {where}."]
    floors = sol.floors()
    if floors:
        lines.append("A workload's floor is the longer of bytes / memory bandwidth and flops / peak throughput of "
                     "its arithmetic: no kernel can be faster. The fraction of the floor (floor / latency) shows "
                     "the headroom left; a result above 100% is implausible (a measurement or correctness "
                     "problem).")
    rows = [["workload", "bytes", "flops", "arithmetic"] + (["floor us", "bound"] if floors else [])]
    for w in task.feedback_workloads():
        work = sol.work.get(w.name)
        if not w.timed or work is None:
            continue
        if not isinstance(work, Work):
            rows.append([w.name, work])
            continue
        f = floors.get(w.name)
        rows.append([w.name, fmt_bytes(work.bytes), fmt_flops(work.flops), work.compute]
                    + ([f"{f.floor_us:.4g}", f.bound] if f else (["-", "-"] if floors else [])))
    if len(rows) > 1:
        lines.append(table(rows))
    shown = [sol.work.get(row[0]) for row in rows[1:]]
    sources = sorted({_SOURCES.get(w.source, w.source) for w in shown if isinstance(w, Work)})
    if sources:
        lines.append(f"(work {'; '.join(sources)})")
    lines += [f"- {row[0]}: {w.note}" for row, w in zip(rows[1:], shown)
              if isinstance(w, Work) and w.note and w.source != "derived from the reference"]
    return "\n".join(lines) + "\n"


_SOURCES = {"task.json": "declared in task.json", "reference speed_of_light()": "from the reference's speed_of_light()",
            "derived from the reference": "derived from the reference: every input read once, every output written once"}


def table(rows: list[list[str]]) -> str:
    """Rows as aligned text columns (the first row is the header)."""
    widths = [max(len(str(row[i])) for row in rows if i < len(row) and len(row) > 2) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip()
                     if len(row) > 2 else "  ".join(map(str, row)) for row in rows)


# ------------------------------------------------------------------------------------------------ evidence


def performance_table(result: EvalResult, sol: SpeedOfLight | None, *, parent: EvalResult | None = None) -> str:
    """Per timed workload: latency against the parent's, the reference's and the baseline's, and the fraction of
    the floor; then the totals, and a warning for a result faster than the floor."""
    fractions = sol.fractions(result) if sol is not None else None
    before = {w.workload: w.latency_us for w in parent.workloads} if parent is not None else {}
    header = ["workload", "latency us"] + (["parent us"] if parent is not None else []) + \
        ["reference us", "baseline us", "vs reference", "vs baseline"] + (["% of floor"] if fractions else [])
    rows = [header]
    for w in result.workloads:
        if not w.timed or w.latency_us is None:
            continue
        row = [w.workload, f"{w.latency_us:.4g}"]
        if parent is not None:
            row.append(_us(before.get(w.workload)))
        row += [_us(w.reference_us), _us(w.baseline_us), _x(w.speedup), _x(w.speedup_vs_baseline)]
        if fractions:
            row.append(fmt_percent(fractions.per_workload.get(w.workload)))
        rows.append(row)
    if len(rows) == 1:
        return ""
    totals = [f"score {result.score:.4g}x vs the reference (geometric mean)"]
    if result.speedup_vs_baseline:
        totals.append(f"{result.speedup_vs_baseline:.4g}x vs the baseline")
    if fractions and fractions.fraction is not None:
        totals.append(f"{fmt_percent(fractions.fraction)} of the floor on {fractions.gpu}")
    text = table(rows) + "\n" + "; ".join(totals) + "."
    if fractions and fractions.implausible:
        text += (f"\nIMPLAUSIBLE: faster than the floor on {', '.join(fractions.implausible)}. The hardware cannot "
                 "do that: suspect the measurement or the output, not a breakthrough.")
    if not result.timing_representative:
        text += "\n(timings from the CPU interpreter: they rank candidates but are not GPU numbers)"
    return text


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}x"


def history_section(history: list[dict], before: list[dict[str, str] | None], files: list[dict[str, str]],
                    *, skip_last: bool, limit: int) -> str:
    """The cycle's attempts so far, oldest first, each with its status, what failed and its change to the code it
    started from (``before``; None: not known), so a fix that already failed is not tried again. The last attempt
    is left out when the prompt shows it whole (``skip_last``); only the latest HISTORY_ATTEMPTS are detailed."""
    items = list(zip(history, before, files))
    if skip_last:
        items = items[:-1]
    if not items or limit <= 0:
        return ""
    lines = ["# This cycle's earlier attempts (oldest first): do not repeat a change that failed"]
    older = items[:-HISTORY_ATTEMPTS]
    if older:
        lines.append("Earlier: " + "; ".join(f"{a['id']} {a['status']}" for a, _, _ in older))
    for attempt, start, code in items[-HISTORY_ATTEMPTS:]:
        lines.append(f"- {attempt['id']} ({attempt['prompt_kind']}): {_outcome(attempt)}")
        diff = code_diff(start, code or {}) if start is not None else ""
        if diff:
            lines.append(f"  its change to the code it started from ({attempt.get('derived_from')}):\n"
                         f"```diff\n{diff}\n```")
    text = "\n".join(lines) + "\n"
    return text if len(text) <= limit else text[: max(0, limit - 40)] + "\n[... cut to fit the model's context]\n"


def _outcome(attempt: dict) -> str:
    if attempt["status"] == "passed":
        latency = f", {attempt['latency_us']:.4g} us" if attempt.get("latency_us") else ""
        return f"passed, score {attempt['score']:.4g}x{latency}"
    error = headline(attempt.get("log"))
    return attempt["status"] + (f": {error}" if error else "")


def code_diff(before: dict[str, str], after: dict[str, str]) -> str:
    """A unified diff of two versions of the files, at most HISTORY_DIFF_LINES lines."""
    lines: list[str] = []
    for name in sorted(set(before) | set(after)):
        lines += difflib.unified_diff((before.get(name) or "").splitlines(), (after.get(name) or "").splitlines(),
                                      f"a/{name}", f"b/{name}", n=1, lineterm="")
    if len(lines) > HISTORY_DIFF_LINES:
        lines = lines[:HISTORY_DIFF_LINES] + [f"[... {len(lines) - HISTORY_DIFF_LINES} more diff lines]"]
    return "\n".join(lines)
