"""Evaluate one candidate in this process; see ksearch_graph/_evaluate_child.py (the one copy of the code, shipped
inside the package so a non-editable install has it too). Run by path, so ksearch_graph itself is never imported."""
import runpy
from pathlib import Path

runpy.run_path(str(Path(__file__).resolve().parents[1] / "ksearch_graph" / "_evaluate_child.py"), run_name="__main__")
