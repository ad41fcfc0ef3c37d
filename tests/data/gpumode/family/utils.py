"""The shared helpers of this test competition: the device, an elementwise check in the make_match_reference form."""
import torch


def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def match_reference(data, output, reference, rtol=1e-05, atol=1e-08):
    expected = reference(data)
    if output.shape != expected.shape:
        return False, "SIZE MISMATCH"
    bad = (output.float() - expected.float()).abs() > atol + rtol * expected.float().abs()
    return (False, f"Number of mismatched elements: {int(bad.sum())}") if bool(bad.any()) else (True, "")


def make_match_reference(reference, **kwargs):
    def check(data, output):
        return match_reference(data, output, reference=reference, **kwargs)
    return check
