"""Fingerprints of outputs (harness/tensors.py): bit-exact device checksums."""

from __future__ import annotations

import math

import torch

from ksearch_graph.harness import _torch, tensors

CUDA = torch.cuda.is_available()


def test_fingerprints_are_bit_exact_checksums_of_any_tensor(monkeypatch):
    """The checksum that catches an output changed after its call (and inputs that differ between the processes):
    equal bits give equal fingerprints, NaNs included; one changed bit, a sign of zero, a swapped dtype, sign flips
    that cancel in a sum of words do not. Views at any offset, odd byte counts, bools, complex (conjugate views too),
    float8 and empty tensors all work, and big tensors are summed a chunk at a time."""

    _torch.load_torch()
    x = torch.randn(1001)
    x[7] = float("nan")
    assert tensors.fingerprint((x, 2)) == tensors.fingerprint((x.clone(), 2))
    one_ulp = x.clone()
    one_ulp[500] = torch.nextafter(x[500], torch.tensor(math.inf))
    signed = x.clone()
    signed[3] = 0.0
    negative = signed.clone()
    negative[3] = -0.0
    assert tensors.fingerprint(one_ulp) != tensors.fingerprint(x) and tensors.fingerprint(signed) != tensors.fingerprint(negative)
    assert tensors.fingerprint(x.view(torch.int32)) != tensors.fingerprint(x)  # same bits, another dtype
    half = torch.randn(1001).half()
    for view in (half[1:], half[3:], torch.randn(6, 5)[:, 1], torch.ones(3, dtype=torch.bool),
                 torch.randn(4, dtype=torch.complex64), torch.zeros(0), torch.tensor(2.5)):
        assert tensors.fingerprint(view) == tensors.fingerprint(view.clone()), view
        changed = view.clone()
        if changed.numel():
            changed.view(-1)[-1] = 0 if changed.view(-1)[-1] != 0 else 1
            assert tensors.fingerprint(changed) != tensors.fingerprint(view), view
    negatives = torch.tensor([-1.0, -2.0, 3.0])  # two sign bits cleared: a sum modulo 2**32 would not change
    assert tensors.fingerprint(negatives.abs()) != tensors.fingerprint(negatives)
    balanced = torch.tensor([-1.0, 3.0, 2.0, -5.0])  # negated: two sign bits set, two cleared
    assert tensors.fingerprint(-balanced) != tensors.fingerprint(balanced)
    z = torch.randn(6, dtype=torch.complex64)
    assert tensors.fingerprint(z.conj()) == tensors.fingerprint(z.conj().resolve_conj()) != tensors.fingerprint(z)
    fp8 = torch.randn(9).to(torch.float8_e4m3fn)  # no value sum for float8: the word sum still sees a change
    assert tensors.fingerprint(fp8) == tensors.fingerprint(fp8.clone()) != tensors.fingerprint((-fp8.float()).to(fp8.dtype))
    chunked = torch.randn(1000)
    whole = tensors.fingerprint(chunked)
    monkeypatch.setattr(tensors, "CHECKSUM_CHUNK", 64)  # the int64 copies, a chunk at a time, add up the same
    assert tensors.fingerprint(chunked) == whole


def test_keys_added_to_input_dicts_are_taken_off_and_named():
    """A cache the candidate keeps in its input dict (weights["_cache"] = ...) is left out of what the judge checks
    and named; a removed key or a replaced value stays in the structure, where the judge's comparison fails it."""
    w = torch.ones(3)
    inputs = (torch.zeros(2), {"w": w, "inner": {"b": w}}, [{"n": 3}])
    skeleton = tensors.key_skeleton(inputs)
    inputs[1]["_cache"] = w.t()
    inputs[1]["inner"][7] = "x"
    added = []
    sent = tensors.without_added_keys(inputs, skeleton, added)
    assert added == ["inputs[1]['_cache']", "inputs[1]['inner'][7]"]
    assert type(sent) is tuple and type(sent[2]) is list and sent[1].keys() == {"w", "inner"}
    assert sent[1]["inner"].keys() == {"b"} and sent[1]["w"] is w and "_cache" in inputs[1]  # the live dict kept
    del inputs[2][0]["n"]
    inputs[1]["w"] = w * 2
    added = []
    sent = tensors.without_added_keys(inputs, skeleton, added)
    assert added == ["inputs[1]['_cache']", "inputs[1]['inner'][7]"] and sent[2] == [{}]
    assert torch.equal(sent[1]["w"], w * 2)
