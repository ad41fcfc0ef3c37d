"""SubprocessEvaluator end to end on the softmax example: real child processes, Triton's CPU interpreter.

Every evaluation starts a Python that imports torch (~2.5 s of CPU), so the module fixture submits all of them at
once to a small thread pool and each test waits for its own. That keeps the file well under a minute on two cores
and exercises the evaluator from several threads, as the graph uses it.
"""

from __future__ import annotations

import math
import os
import textwrap
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from ksearch_graph.harness.parent.client import SubprocessEvaluator
from ksearch_graph.search.roles.template import default_params, render_template
from ksearch_graph.tasks.evaluation import EvalResult, Status
from ksearch_graph.tasks.task import Task, load_task

pytestmark = pytest.mark.slow  # every test runs whole evaluations

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "softmax"
# The wall-clock limit of the hanging candidate's evaluation. It must cover the start-up (two processes importing
# torch) while other evaluations start beside it on a 2-core CI machine: at 10 s it sometimes ran out during the
# reference timing, before the candidate's call, and the log could not say the call hung.
HANG_TIMEOUT_S = 20


@pytest.fixture(scope="module")
def task() -> Task:
    return load_task(EXAMPLE)


def wrapping_seed(task: Task, body: str) -> dict[str, str]:
    """A candidate whose softmax runs ``body``, with the seed solution importable as ``naive`` from a helper file."""
    kernel = "import os, signal, subprocess\nfrom naive import softmax as naive\n\n\ndef softmax(x):\n"
    return {"kernel.py": kernel + textwrap.indent(body, "    ") + "\n", "naive.py": task.seed_source}


# Warnings that libraries raise with a stacklevel past their own frame: attributed to the harness's frames (its import
# of the candidate, its timed call), which gives the harness's modules a __warningregistry__.
WARNS = """\
import warnings

from naive import softmax as naive

warnings.warn("this module is deprecated", DeprecationWarning, stacklevel=2)


def softmax(x):
    for level in (2, 3, 4):
        warnings.warn("a slow path", UserWarning, stacklevel=level)
    return naive(x)
"""


@pytest.fixture(scope="module")
def hang_mark() -> str:
    """A sleep duration no other process uses: the hanging candidate's grandchild is found by it in /proc (its
    sandbox hides the host's /tmp and has its own PID numbers, so the candidate cannot tell the test its ids)."""
    return f"300.{os.getpid()}{int(time.time()) % 100000}"


@pytest.fixture(scope="module")
def results(task, hang_mark) -> dict[str, Future]:
    quick = SubprocessEvaluator(timeout_s=90, time_budget_s=0.2)
    hang = SubprocessEvaluator(timeout_s=HANG_TIMEOUT_S, time_budget_s=0.2)
    hang_body = f"""\
subprocess.Popen(["sleep", "{hang_mark}"])  # a grandchild must die with the evaluation
while True:
    pass"""
    jobs = {
        "hang": (hang, wrapping_seed(task, hang_body)),  # first: it takes longest
        "seed": (quick, {"kernel.py": task.seed_source}),
        "single_pass": (quick, render_template(task, {"VARIANT": "single_pass", "BLOCK_N": 4096})),
        "online": (quick, render_template(task, {"VARIANT": "online", "BLOCK_N": 1024, "ROWS_PER_PROGRAM": 2})),
        "two_pass": (quick, render_template(task, {"VARIANT": "two_pass", "BLOCK_N": 1024})),
        "single_pass_small_block": (quick, render_template(task, {"VARIANT": "single_pass", "BLOCK_N": 256})),
        "syntax_error": (quick, {"kernel.py": "def softmax(x:\n    return x\n"}),
        "raises": (quick, wrapping_seed(task, 'raise ValueError("BLOCK_N must divide cols")')),
        "segfault": (quick, wrapping_seed(task, "os.kill(os.getpid(), signal.SIGSEGV)")),
        "wrong_shape": (quick, wrapping_seed(task, "return naive(x)[:, :-1]")),
        "wrong_dtype": (quick, wrapping_seed(task, "return naive(x).double()")),
        "mutates_input": (quick, wrapping_seed(task, "y = naive(x)\nx.zero_()\nreturn y")),
        "returns_input": (quick, wrapping_seed(task, "return x")),
        "warns": (quick, {"kernel.py": WARNS, "naive.py": task.seed_source}),
        "environment": (quick, wrapping_seed(
            task, "raise RuntimeError(f'visible: {sorted(k for k in os.environ if k.endswith((\"_KEY\", \"_SEED\")))}')"
        )),
    }
    with pytest.MonkeyPatch.context() as mp, ThreadPoolExecutor(max_workers=2) as pool:
        mp.setenv("OPENAI_API_KEY", "sk-must-not-reach-the-candidate")
        yield {name: pool.submit(ev.evaluate, task, files, attempt_id=name) for name, (ev, files) in jobs.items()}


def result(results, name: str) -> EvalResult:
    return results[name].result()


def test_seed_solution_passes(task, results):
    r = result(results, "seed")
    assert r.status == Status.passed, r.log_excerpt
    assert [w.workload for w in r.workloads] == [w.name for w in task.feedback_workloads()]
    for w in r.workloads:
        assert w.correct and w.runs >= 3 and w.latency_us > 0 and w.reference_us > 0
        assert w.speedup == pytest.approx(w.reference_us / w.latency_us)
        # Whether the heat found the GPU at its power limit: a bool on a GPU (the softmax is memory-bound and light,
        # far from an H200's 700 W), not asked on a CPU.
        assert w.power_limited is (False if r.environment["device"] == "cuda" else None)
    assert r.score == pytest.approx(math.exp(sum(math.log(w.speedup) for w in r.workloads) / len(r.workloads)))
    assert r.score > 0 and r.compile_s > 0 and r.wall_s > r.compile_s
    # CPU (interpreter) timings only rank candidates; GPU timings are the real thing.
    assert r.timing_representative == (r.environment["device"] == "cuda")


def test_a_candidate_whose_warnings_point_at_the_harness_passes(results):
    """warnings.warn gives the module a warning is attributed to a ``__warningregistry__``; on the harness's modules
    that is not the candidate changing them (a CuPy and torch-extension candidate was flagged so on an H100)."""
    r = result(results, "warns")
    assert r.status == Status.passed, r.log_excerpt


@pytest.mark.parametrize("variant", ["single_pass", "online", "two_pass"])
def test_template_variants_pass(results, variant):
    r = result(results, variant)
    assert r.status == Status.passed, r.log_excerpt
    assert r.score > 0


def test_single_pass_with_a_block_narrower_than_the_row_is_wrong(results):
    r = result(results, "single_pass_small_block")
    assert r.status == Status.incorrect_numerical
    # On CPU the uncovered columns hold stale values; on a GPU the harness's NaN-poisoned memory shows through.
    assert "workload 16x300" in r.log_excerpt
    assert "outside atol" in r.log_excerpt or "NaN/Inf pattern differs" in r.log_excerpt
    assert r.score == 0 and r.workloads[-1].correct is False


def test_syntax_error_is_a_compile_error(results):
    r = result(results, "syntax_error")
    assert r.status == Status.compile_error
    assert "SyntaxError" in r.log_excerpt and "kernel.py" in r.log_excerpt


def test_exception_gives_a_short_excerpt_of_the_candidates_code(results):
    r = result(results, "raises")
    assert r.status == Status.runtime_error
    assert "ValueError: BLOCK_N must divide cols" in r.log_excerpt
    assert 'File "kernel.py"' in r.log_excerpt
    assert "ksearch_graph" not in r.log_excerpt and "Traceback" not in r.log_excerpt
    assert len(r.log_excerpt) < 500


def test_hang_times_out_and_its_processes_are_killed(results, hang_mark):
    r = result(results, "hang")
    assert r.status == Status.timeout, r.log_excerpt
    assert HANG_TIMEOUT_S <= r.wall_s < HANG_TIMEOUT_S + 5
    assert "correctness" in r.log_excerpt  # says where it hung
    deadline = time.monotonic() + 2
    while _live_with_arg(hang_mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _live_with_arg(hang_mark) == []


def test_segfault_is_a_runtime_error_naming_the_signal(results):
    r = result(results, "segfault")
    assert r.status == Status.runtime_error
    assert "SIGSEGV" in r.log_excerpt


def test_wrong_shape_and_dtype(results):
    assert result(results, "wrong_shape").status == Status.incorrect_shape
    r = result(results, "wrong_dtype")
    assert r.status == Status.incorrect_dtype and "torch.float64" in r.log_excerpt


def test_writing_into_the_input_is_suspicious(results):
    assert result(results, "mutates_input").status == Status.suspicious


def test_returning_the_input_is_wrong(results):
    assert result(results, "returns_input").status == Status.incorrect_numerical


def test_secrets_and_the_seed_do_not_reach_the_candidate(results):
    r = result(results, "environment")
    assert r.status == Status.runtime_error
    assert "visible: []" in r.log_excerpt


def test_unsafe_file_names_are_rejected_without_running(task):
    ev = SubprocessEvaluator()
    for name in ("../escape.py", "/abs/kernel.py", "a/../../b.py"):
        r = ev.evaluate(task, {name: "x = 1\n"}, attempt_id="bad-name")
        assert r.status == Status.compile_error and "not a relative path" in r.log_excerpt


def test_render_template_validates_parameters(task):
    params = default_params(task)
    assert params["VARIANT"] == "online"
    source = render_template(task, {})["kernel.py"]
    assert 'VARIANT = "online"' in source and "BLOCK_N = 256" in source and "{{" not in source
    with pytest.raises(ValueError, match="unknown"):
        render_template(task, {"BLOCK_M": 64})
    with pytest.raises(ValueError, match="not one of"):
        render_template(task, {"BLOCK_N": 100})


def _live_with_arg(arg: str) -> list[int]:
    """Processes, not zombies (a killed grandchild may wait a moment to be reaped), with ``arg`` on their command
    line."""
    live = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if arg in (proc / "cmdline").read_bytes().decode(errors="replace").split("\0") and \
                    (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                live.append(int(proc.name))
        except OSError:
            continue
    return live
