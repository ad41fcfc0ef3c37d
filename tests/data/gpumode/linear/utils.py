"""Helpers of this test problem: the seeding and tolerance check its reference.py uses."""
import random

import torch


def set_seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def match_reference(data, output, reference, rtol=1e-05, atol=1e-08):
    """(passed, message): values compared in float32 within atol + rtol * |expected|."""
    expected = reference(data)
    if output.shape != expected.shape:
        return False, "SIZE MISMATCH"
    bad = (output.float() - expected.float()).abs() > atol + rtol * expected.float().abs()
    return (False, f"Number of mismatched elements: {int(bad.sum())}") if bool(bad.any()) else (True, "")


def make_match_reference(reference, **kwargs):
    def check(data, output):
        return match_reference(data, output, reference=reference, **kwargs)
    return check
