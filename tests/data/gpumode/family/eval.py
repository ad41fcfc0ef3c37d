"""The shared evaluator of this test competition; ksearch reads only its get_test_cases (never runs it): each spec
part matches the regex below, integers become int, bracketed integer lists tuples, anything else stays a string."""
import re
import sys


def get_test_cases(file_name):
    cases = []
    match = r"\s*([a-zA-Z_]+)\s*:\s*(\[[^\]]*\]|[a-zA-Z_]+|[+-]?[0-9]+)\s*"
    for line in open(file_name).read().splitlines():
        case = {}
        for part in line.split(";"):
            key, value = re.fullmatch(match, part).groups()
            try:
                value = int(value)
            except ValueError:
                if value.startswith("["):
                    value = tuple(int(x) for x in value[1:-1].split(","))
            case[key] = value
        cases.append(case)
    return cases


if __name__ == "__main__":
    sys.exit("run by GPU MODE's runner only")
