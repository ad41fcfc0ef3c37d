"""Evaluate one candidate from a checkout, as the search does: the judge process of ksearch_graph/harness/judge.py
(the one copy of the code, shipped inside the package so a non-editable install has it too). Its flags: --help.

``--task`` may name a GPU MODE problem folder (task.yml and reference.py, no task.json): it is turned into a task
folder (ksearch_graph.gpumode) in a temporary folder, the judge runs on it as a child process, and the folder is
removed once the judge is done. Otherwise this process is the judge, and imports only the standard library, torch and
the harness."""
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JUDGE = ROOT / "ksearch_graph" / "harness" / "judge.py"


def gpumode_problem(argv: list[str]) -> tuple[int, Path] | None:
    """(index of the --task argument, the folder) where --task names a GPU MODE problem folder."""
    for i, arg in enumerate(argv):
        value = argv[i + 1] if arg == "--task" and i + 1 < len(argv) else arg[7:] if arg.startswith("--task=") else None
        if value and (Path(value) / "task.yml").is_file() and not (Path(value) / "task.json").exists():
            return i, Path(value)
    return None


def evaluate_problem(argv: list[str], i: int, folder: Path) -> int:
    """The judge, as a child process, on a task folder made from the GPU MODE problem ``folder``."""
    from ksearch_graph.gpumode import materialise_gpumode
    from ksearch_graph.task import TaskError

    with tempfile.TemporaryDirectory(prefix="ksearch-task-") as tmp:
        try:
            task = str(materialise_gpumode(folder, Path(tmp) / "task"))
        except TaskError as e:
            sys.exit(f"error: {e}")
        argv = argv[:i] + ["--task", task] + argv[i + (2 if argv[i] == "--task" else 1):]
        return subprocess.call([sys.executable, str(JUDGE), *argv])


sys.path.insert(0, str(ROOT))
found = gpumode_problem(sys.argv[1:])
if found is not None:
    sys.exit(evaluate_problem(sys.argv[1:], *found))
from ksearch_graph.harness.judge import process_main  # noqa: E402  (stdlib, torch and the harness only)

process_main()
