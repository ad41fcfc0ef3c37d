"""Evaluate one candidate from a checkout, as the search does: the judge process of ksearch_graph/harness/judge/judge.py
(the one copy of the code, shipped inside the package so a non-editable install has it too). Its flags: --help.

``--task`` may name any task source ``ksearch run`` takes besides a task folder: a GPU MODE problem folder, a
KernelBench problem file, a FlashInfer-Trace definition file (ksearch_graph.tasks.task_sources). It is turned into a task
folder in a temporary folder, the judge runs on it as a child process, and the folder is removed once the judge is
done. Otherwise this process is the judge, and imports only the standard library, torch and the harness."""
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JUDGE = ROOT / "ksearch_graph" / "harness" / "judge" / "judge.py"


def task_source(argv: list[str]) -> tuple[int, Path] | None:
    """(index of the --task argument, the path) where --task names a task source that is not a task folder."""
    for i, arg in enumerate(argv):
        value = argv[i + 1] if arg == "--task" and i + 1 < len(argv) else arg[7:] if arg.startswith("--task=") else None
        if value and Path(value).exists() and not (Path(value) / "task.json").exists() \
                and Path(value).name != "task.json":
            return i, Path(value)
    return None


def evaluate_problem(argv: list[str], i: int, source: Path) -> int:
    """The judge, as a child process, on a task folder made from the task source ``source``."""
    from ksearch_graph.tasks.task import TaskError
    from ksearch_graph.tasks.task_sources import materialise

    with tempfile.TemporaryDirectory(prefix="ksearch-task-") as tmp:
        try:
            task = str(materialise(source, Path(tmp) / "task"))
        except TaskError as e:
            sys.exit(f"error: {e}")
        argv = argv[:i] + ["--task", task] + argv[i + (2 if argv[i] == "--task" else 1):]
        return subprocess.call([sys.executable, str(JUDGE), *argv])


sys.path.insert(0, str(ROOT))
found = task_source(sys.argv[1:])
if found is not None:
    sys.exit(evaluate_problem(sys.argv[1:], *found))
from ksearch_graph.harness.judge.judge import process_main  # noqa: E402  (stdlib, torch and the harness only)

process_main()
