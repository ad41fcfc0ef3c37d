"""The repository's documentation stands alone.

Every relative link in README.md, BENCHMARKS.md and docs/*.md names a file inside the repository (and, with a
``#fragment``, a heading or an ``<a id>`` of that file), and no file points to documents kept outside it.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", REPO / "BENCHMARKS.md", *sorted((REPO / "docs").glob("*.md"))]
# Written in two pieces so that this file does not contain what it looks for.
OUTSIDE = ("../" + "shared", "shared" + "/docs")

FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
INLINE_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s*\[[^\]\n]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
EXPLICIT_ID = re.compile(r"""<a\s+(?:id|name)=["']([^"']+)["']""")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def links(text: str) -> list[str]:
    text = INLINE_CODE.sub("", FENCE.sub("", text))
    return INLINE_LINK.findall(text) + REFERENCE_LINK.findall(text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"<[^>]+>", "", heading).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return set(EXPLICIT_ID.findall(text)) | {slug(h) for h in HEADING.findall(text)}


def is_external(target: str) -> bool:
    return bool(re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves_inside_the_repository(doc: Path):
    broken = []
    for target in links(doc.read_text()):
        if is_external(target):
            continue
        path_part, _, fragment = target.partition("#")
        dest = (doc.parent / path_part).resolve() if path_part else doc
        if REPO not in dest.parents and dest != REPO:
            broken.append(f"{target}: outside the repository")
        elif not dest.exists():
            broken.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target}: no heading or anchor '{fragment}' in {dest.relative_to(REPO)}")
    assert not broken, f"{doc.relative_to(REPO)}:\n  " + "\n  ".join(broken)


def test_the_docs_this_test_reads_exist():
    names = {p.relative_to(REPO).as_posix() for p in DOCS}
    assert {"README.md", "BENCHMARKS.md", "docs/method.md", "docs/tasks.md", "docs/harness.md"} <= names


def repository_files() -> list[Path]:
    """Tracked files and new files git does not ignore; without git, every file outside hidden and build folders."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                             capture_output=True, check=True).stdout
        return [REPO / name for name in out.decode().split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        skip = {"__pycache__", "build", "dist", "runs", "venv"}
        files = []
        for root, dirs, names in os.walk(REPO):
            dirs[:] = [d for d in dirs if not d.startswith(".") and d not in skip and not d.endswith(".egg-info")]
            files += [Path(root) / n for n in names]
        return files


def test_no_file_points_outside_the_repository():
    offenders = []
    for path in repository_files():
        if not path.is_file():
            continue
        try:
            text = path.read_text(errors="ignore")
        except OSError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if any(needle in line for needle in OUTSIDE):
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()[:100]}")
    assert not offenders, "files point to documents outside the repository:\n  " + "\n  ".join(offenders)


def test_the_link_checker_sees_a_broken_link(tmp_path: Path):
    """The checker itself: a missing file, a missing anchor and an escape from the repository are all found."""
    text = "[a](docs/method.md) [b](nothing-here.md) [c](docs/method.md#no-such-heading) `[d](ignored.md)`\n"
    found = links(text)
    assert found == ["docs/method.md", "nothing-here.md", "docs/method.md#no-such-heading"]
    assert slug("The loop") in anchors(REPO / "docs" / "method.md")
    assert "no-such-heading" not in anchors(REPO / "docs" / "method.md")
    assert not (REPO / "nothing-here.md").exists()
