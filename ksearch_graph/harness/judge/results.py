"""The evaluation's result, an EvalResult-shaped dict: what it starts as, the score and notes once every timed
workload passed, and the file the parent reads."""

from __future__ import annotations

import json
import math
import os
import statistics


def new_result() -> dict:
    """A result that has not passed yet (a judge that dies leaves this)."""
    return {"status": "runtime_error", "workloads": [], "score": 0.0, "latency_us": None, "compile_s": 0.0,
            "wall_s": 0.0, "log_excerpt": "", "timing_representative": False, "environment": {}}


def geomean(values: list[float]) -> float:
    if not values or any(v <= 0 for v in values):
        return 0.0
    return math.exp(sum(math.log(v) for v in values) / len(values))


def summarise(result: dict, results: dict, timed: list[dict], notes: list[str], sources: dict[str, int],
              has_baseline: bool, added_keys: list[str], host_timed: list[str]) -> None:
    """A passed evaluation's summary in ``result``: where the reference timings came from, the geometric means over
    the timed workloads' ``results`` rows, and the flags and ``notes`` the log excerpt carries."""
    used = [(source, n) for source, n in sources.items() if n]
    result["environment"]["reference_timing"] = "; ".join(
        source if len(used) == 1 and source.startswith("measured") else f"{n} of {len(timed)} workloads {source}"
        for source, n in used) or "no timed workloads"

    rows = [results[w["name"]] for w in timed]
    result["status"] = "passed"
    result["score"] = geomean([r["speedup"] for r in rows])
    result["latency_us"] = geomean([r["latency_us"] for r in rows])
    if has_baseline:
        result["speedup_vs_baseline"] = geomean([r["speedup_vs_baseline"] for r in rows])
        result["baseline_score"] = 100 * statistics.fmean(r["speedup_vs_baseline"] for r in rows)
    if result["timing_representative"]:
        notes += [f"{n}: speedup {r['speedup']:.1f}x is implausibly high, worth a second look"
                  for n, r in results.items() if (r.get("speedup") or 0) > 10]
    if "calls_reference" in result.get("flags", []):
        notes.append("the candidate calls the task's reference implementation")
    if added_keys:
        result.setdefault("flags", []).append("added_input_keys")
        notes.append(f"the candidate added keys to its input dicts ({', '.join(added_keys[:5])}): judged and "
                     "timed as usual; every timed call gets fresh inputs, so a cache kept there is never reused")
    if host_timed:
        result.setdefault("flags", []).append("timed_by_host_clock")
    result["log_excerpt"] = "\n".join(notes)


def write_signed(result: dict, path: str, key: str) -> None:
    """Write the result to ``path`` at once; with a ``key``, its first line is an HMAC of the rest, which the parent
    checks."""
    text = json.dumps(result, indent=1)
    if key:  # first line: HMAC of the rest, which the parent checks
        import hashlib
        import hmac

        text = hmac.new(key.encode(), text.encode(), hashlib.sha256).hexdigest() + "\n" + text
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)  # the parent never sees a half-written file
