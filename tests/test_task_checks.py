"""A task's own check (harness/task_checks.py), called as GPU MODE's eval.py calls check_implementation, on
hand-written checkers of the four kinds GPU MODE's problems use: plain allclose, exact (histogram), a tolerance that
grows with the size (prefix sum), and a property check (a QR factorisation, which is not unique)."""

from __future__ import annotations

import json
import math
import textwrap

import pytest
import torch

from ksearch_graph.harness.task_checks import load_check, parse_check, run_check, verdict

CHECKS = textwrap.dedent('''
    import torch

    def ref_kernel(data):
        x, out = data
        out[...] = torch.cumsum(x, 0)  # writes its output buffer, as GPU MODE's pmpp_v2 references do
        return out

    def allclose(data, output):
        expected = ref_kernel(data)
        ok = torch.allclose(output, expected, rtol=1e-3, atol=1e-3)
        return ok, "" if ok else "mismatch found! values differ"

    def exact(data, output):  # the old form: one string, empty when it passed
        return "" if torch.equal(output, torch.bincount(data[0], minlength=8)) else "mismatch found! not equal"

    def scaled(data, output):  # prefix sum: 1e-5 * sqrt(n), as GPU MODE's prefixsum check
        n = data[0].numel()
        tol = 1e-5 * n ** 0.5
        ok = torch.allclose(output, torch.cumsum(data[0], 0), rtol=tol, atol=tol)
        return ok, f"tolerance {tol:.2e}"

    def qr_property(data, output):  # Q @ R rebuilds A and Q is orthogonal; signs of the factors are free
        a = data[0]
        q, r = output
        n = a.shape[-1]
        recon = (q.double() @ r.double() - a.double()).abs().max().item()
        orth = (q.double().T @ q.double() - torch.eye(n, dtype=torch.float64)).abs().max().item()
        ok = recon < 1e-4 and orth < 1e-4 and torch.equal(r, torch.triu(r))
        return ok, f"reconstruction {recon:.1e}, orthogonality {orth:.1e}"

    def broken(data, output):
        raise KeyError("no such weight")

    def malformed(data, output):
        return True, "", "extra"
''')


@pytest.fixture()
def task_dir(tmp_path):
    (tmp_path / "checks.py").write_text(CHECKS)
    return tmp_path


def check(task_dir, function, inputs, output, expected):
    task = {"check": parse_check({"module": "checks.py", "function": function}, "task.json")}
    return run_check(str(task_dir), task, inputs, output, expected)


def test_allclose_check_on_the_judges_copies(task_dir):
    x = torch.arange(6.0)
    buffer = torch.full((6,), math.nan)  # an output buffer among the inputs, as make_inputs poisons it
    inputs = ((x, buffer),)
    expected = torch.cumsum(x, 0)
    assert check(task_dir, "allclose", inputs, expected.clone(), [expected]) == (None, "")
    status, message = check(task_dir, "allclose", inputs, expected + 1, [expected])
    assert (status, message) == ("incorrect_numerical", "mismatch found! values differ")
    assert torch.isnan(buffer).all(), "the checker's reference wrote into a copy, not the judge's inputs"


def test_exact_check_in_the_old_string_form(task_dir):
    data = torch.tensor([0, 1, 1, 7])
    counts = torch.bincount(data, minlength=8)
    assert check(task_dir, "exact", ((data, None),), counts.clone(), [counts]) == (None, "")
    off = counts.clone()
    off[1] += 1
    assert check(task_dir, "exact", ((data, None),), off, [counts]) == ("incorrect_numerical",
                                                                         "mismatch found! not equal")


def test_tolerance_that_grows_with_the_size(task_dir):
    for n, error, passes in ((100, 5e-5, True), (100, 5e-4, False), (10_000, 5e-4, True)):
        x = torch.ones(n, dtype=torch.float64)
        expected = torch.cumsum(x, 0)
        status, message = check(task_dir, "scaled", ((x, None),), expected * (1 + error), [expected])
        assert (status is None) == passes, (n, error, message)
        assert message == f"tolerance {1e-5 * n ** 0.5:.2e}"


def test_property_check_accepts_another_factorisation(task_dir):
    torch.manual_seed(0)
    a = torch.randn(5, 5, dtype=torch.float64)
    q, r = torch.linalg.qr(a)
    flipped = (-q, -r)  # also a QR factorisation of a, unequal to the reference's elementwise
    assert check(task_dir, "qr_property", ((a,),), flipped, [q, r])[0] is None
    status, message = check(task_dir, "qr_property", ((a,),), (q, r + 1e-2 * torch.triu(torch.ones(5, 5))), [q, r])
    assert status == "incorrect_numerical" and message.startswith("reconstruction")


def test_what_the_candidate_returned_decides_who_is_to_blame(task_dir):
    a = torch.randn(4, 4, dtype=torch.float64)
    q, r = torch.linalg.qr(a)
    # Not tensors at all: the runner sends the type's name.
    assert check(task_dir, "qr_property", ((a,),), "dict", [q, r])[0] == "incorrect_shape"
    # One tensor where two are expected: the check trips over it, the candidate is to blame.
    status, message = check(task_dir, "qr_property", ((a,),), q, [q, r])
    assert status == "incorrect_shape" and "returned 1 tensors, the reference 2" in message and "raised" in message
    # The right structure and still an exception: the task's check is broken.
    status, message = check(task_dir, "broken", ((a,),), (q, r), [q, r])
    assert status == "runtime_error" and "KeyError" in message and "a task bug" in message
    status, message = check(task_dir, "malformed", ((a,),), (q, r), [q, r])
    assert status == "runtime_error" and "tuple of 3 items" in message


def test_verdicts_read_as_gpu_modes_eval_reads_them():
    assert verdict((True, "fine")) == (True, "fine")
    assert verdict((False, "bad")) == (False, "bad")
    assert verdict("") == (True, "")
    assert verdict("mismatch") == (False, "mismatch")
    with pytest.raises(ValueError, match="tuple of 1 items"):
        verdict((True,))


def test_the_check_module_is_the_reference_the_judge_already_imported(task_dir, monkeypatch):
    import sys
    import types

    reference = types.ModuleType("ksearch_reference")
    reference.__file__ = str(task_dir / "checks.py")
    reference.allclose = lambda data, output: (True, "from the judge's module")
    monkeypatch.setitem(sys.modules, "ksearch_reference", reference)
    fn = load_check(str(task_dir / "."), {"check": {"module": "checks.py", "function": "allclose"}})
    assert fn(None, None) == (True, "from the judge's module")


@pytest.mark.parametrize("raw, message", [
    ({"module": "../elsewhere.py", "function": "f"}, "inside the task folder"),
    ({"module": "/abs/checks.py", "function": "f"}, "inside the task folder"),
    ({"module": "checks.txt", "function": "f"}, "inside the task folder"),
    ({"module": "checks.py", "function": "not a name"}, "a Python name"),
    ({"module": "checks.py"}, "must be"),
    ("checks.py:f", "must be"),
])
def test_malformed_check_fields_are_named(raw, message):
    with pytest.raises(ValueError, match=message):
        parse_check(raw, "task.json")


def test_task_loader_names_a_malformed_check(tmp_path):
    from ksearch_graph.tasks.task import TaskError, load_task

    (tmp_path / "spec.md").write_text("x")
    (tmp_path / "reference.py").write_text("x = 1\n")
    (tmp_path / "task.json").write_text(json.dumps({
        "name": "t", "entry_point": "f", "workloads": [{"name": "w", "params": {}}],
        "check": {"module": "../x.py", "function": "f"}}))
    with pytest.raises(TaskError, match=r"check.*inside the task folder"):
        load_task(tmp_path)
