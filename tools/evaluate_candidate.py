"""Evaluate one candidate from a checkout, as the search does: the judge process of ksearch_graph/harness/judge.py
(the one copy of the code, shipped inside the package so a non-editable install has it too). Its flags: --help."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ksearch_graph.harness.judge import process_main  # noqa: E402  (stdlib, torch and the harness only)

process_main()
