"""A Python file loaded as a module (a task's reference or check, a candidate's entry file), registered under its
name: Triton's JIT and dataclasses look a module up by name."""

from __future__ import annotations

import importlib.util
import sys


def load_module(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
