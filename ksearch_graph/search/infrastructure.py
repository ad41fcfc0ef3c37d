"""Evaluations the candidate did not cause to fail: tried again, recorded apart, never charged to the candidate.

An evaluation that ends in ``infrastructure_error`` (harness/parent/failures.py: a pool slot or Ray worker that failed, a
worker lost twice, the judge's own crash, the task's reference failing, a disk the evaluation cannot write) is
logged as an ``infrastructure`` event, never recorded as an attempt: no iteration is spent, the coder never sees it
as its error and the action is not marked failed. It is tried again, up to TRIES evaluations (the local pool lends
the next free slot, so another slot where there is one; Ray schedules it anew). When all of them failed so, a
control decides whose failure it is: code known to pass (the task's seed, else the run's best attempt) is evaluated
the same way.

- The control fails too, or there is none: the infrastructure is down. ``InfrastructureDown`` stops the run (exit
  code 69) with nothing charged; ``ksearch resume`` evaluates the same candidate again, its code reused (no LLM call).
- The control passes: the machinery works and this candidate breaks it (a judge it crashes, a worker it kills).
  Its last result is recorded as its ``runtime_error``, so a run never stalls on one candidate.
"""

from __future__ import annotations

from collections.abc import Callable

from ksearch_graph.harness.parent.failures import classify
from ksearch_graph.tasks.evaluation import EvalResult, Status

TRIES = 3  # evaluations of one attempt that failed outside the candidate before the control decides


class InfrastructureDown(RuntimeError):
    """The evaluation infrastructure failed TRIES times in a row, and known-good code fails there as well."""

    def __init__(self, attempt_id: str, reasons: list[str], control: str, detail: str = ""):
        self.attempt_id, self.reasons, self.detail = attempt_id, reasons, detail  # detail: the last log's headline
        distinct = list(dict.fromkeys(reasons))
        super().__init__(f"the evaluation of {attempt_id} failed {len(reasons)} times in a row outside the "
                         f"candidate's code ({'; '.join(distinct)}), and {control}. Nothing was charged to any "
                         "candidate")


Evaluate = Callable[[dict[str, str], str], EvalResult]


def evaluate_guarded(evaluate: Evaluate, files: dict[str, str], attempt_id: str, *,
                     control: dict[str, str] | None, reference: str | None = None,
                     on_failure: Callable[[EvalResult, int], None] = lambda result, try_number: None) -> EvalResult:
    """``evaluate(files, attempt_id)``, tried again while it fails outside the candidate (see the module docstring;
    ``reference``: the task's reference file, to tell its failures). Returns the candidate's own result; raises
    InfrastructureDown when the infrastructure is down."""
    from ksearch_graph.tasks.evaluation import error_headline

    reasons: list[str] = []
    result = None
    for try_number in range(1, TRIES + 1):
        result = classify(evaluate(files, attempt_id), reference=reference)
        if not result.infrastructure_failed:
            return result
        reasons.append(result.infrastructure)
        on_failure(result, try_number)
    detail = error_headline(result.log_excerpt)
    if control is None:
        raise InfrastructureDown(attempt_id, reasons, "there is no code known to pass to tell whose failure it is",
                                 detail)
    check = classify(evaluate(control, f"{attempt_id}:control"), reference=reference)
    if not check.passed:
        said = check.infrastructure or check.status.value
        raise InfrastructureDown(attempt_id, reasons, f"code known to pass fails there too ({said})", detail)
    return EvalResult(
        status=Status.runtime_error, environment=result.environment, wall_s=result.wall_s,
        log_excerpt=f"the evaluation failed {TRIES} times in a row ({result.infrastructure}) while code known to "
                    f"pass evaluates there: this candidate breaks the evaluation.\n{result.log_excerpt}"[:2000])
