"""The package's layout, as docs/architecture.md draws it: rooms that import one way, no import circle (imports
inside functions included), no module past 500 lines, at most 10 entries at the top of ksearch_graph/."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ksearch_graph"
# Bottom to top: a room imports only from rooms at or below it.
ROOMS = ["config", "harness", "tasks", "harness.parent", "rundir", "llm", "search", "reports", "app", "cli"]


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: dict) -> set[str]:
    """Every module of the package that ``name`` imports, at the top or inside a function."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and known[target].name != "__init__.py":
                out.add(target)
    return out


def room(name: str) -> str:
    parts = name.split(".")[1:]
    if parts[:2] == ["harness", "parent"]:
        return "harness.parent"
    return parts[0]


def test_rooms_import_one_way_and_no_module_imports_in_a_circle():
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    upward = [f"{a} -> {b}" for a, bs in graph.items() for b in bs
              if ROOMS.index(room(b)) > ROOMS.index(room(a))]
    assert not upward, upward
    # A circle is a path back to where it started; depth-first search with colours.
    colour, circles = {}, []

    def visit(node: str, trail: list[str]) -> None:
        colour[node] = "grey"
        for nxt in sorted(graph[node]):
            if colour.get(nxt) == "grey":
                circles.append(trail[trail.index(nxt):] + [nxt])
            elif nxt not in colour:
                visit(nxt, [*trail, nxt])
        colour[node] = "black"

    for name in sorted(graph):
        if name not in colour:
            visit(name, [name])
    assert not circles, circles


def test_no_module_is_longer_than_500_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 500}
    assert not long, long


def test_the_top_of_the_package_has_at_most_10_entries():
    entries = [p.name for p in PACKAGE.iterdir() if p.name != "__pycache__"]
    assert len(entries) <= 10, sorted(entries)
