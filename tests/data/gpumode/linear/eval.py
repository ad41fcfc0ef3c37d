"""This test problem's evaluator, in the shape of GPU MODE's (ours, much smaller): `python eval.py test|benchmark
CASES` with POPCORN_FD set reads one `key: value; ...` spec per line of CASES, as GPU MODE's parser reads it
(integers as int, anything else as a string), and reports `key: value` lines through that file descriptor."""
import math
import os
import re
import sys
import time

import torch

from reference import check_implementation, generate_input
from submission import custom_kernel

PART = re.compile(r"\s*([a-zA-Z]+):\s*([a-zA-Z]+|[+-]?[0-9]+)\s*")


def cases(path):
    for line in open(path).read().splitlines():
        args = {}
        for part in line.split(";"):
            key, value = PART.fullmatch(part).groups()
            args[key] = int(value) if re.fullmatch(r"[+-]?[0-9]+", value) else value
        yield line, args


def main():
    mode, path = sys.argv[1], sys.argv[2]
    out = os.fdopen(int(os.environ["POPCORN_FD"]), "w")
    passed = True
    specs = list(cases(path))
    out.write(f"{mode}-count: {len(specs)}\n")
    for i, (line, args) in enumerate(specs):
        data = generate_input(**args)
        good, message = check_implementation(data, custom_kernel(data))
        out.write(f"{mode}.{i}.spec: {line}\n")
        if not good:
            passed = False
            out.write(f"{mode}.{i}.status: fail\n{mode}.{i}.error: {message}\n")
            continue
        if mode == "benchmark":
            durations = []
            for _ in range(20):
                t0 = time.perf_counter_ns()
                custom_kernel(data)
                durations.append(time.perf_counter_ns() - t0)
            mean = sum(durations) / len(durations)
            std = math.sqrt(sum((d - mean) ** 2 for d in durations) / (len(durations) - 1))
            out.write(f"benchmark.{i}.runs: {len(durations)}\nbenchmark.{i}.mean: {mean}\nbenchmark.{i}.std: {std}\n")
        else:
            out.write(f"test.{i}.status: pass\n")
    out.write(f"check: {'pass' if passed else 'fail'}\n")
    out.close()
    return 0 if passed else 112


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(main())
