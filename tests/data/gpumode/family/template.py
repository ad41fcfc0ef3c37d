"""The competition's template submission: its problems' data ends with the output buffer to fill."""
from task import input_t, output_t


def custom_kernel(data: input_t) -> output_t:
    *_, out = data
    return out
