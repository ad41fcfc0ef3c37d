"""Instantiate a task's parameterised kernel template (the offline coder's "code generation").

A template is a source file with ``{{NAME}}`` placeholders, one per parameter in ``task.json``.
Values are substituted as plain text (``str(value)``), so a string parameter sits inside a string
literal in the template (``VARIANT = "{{VARIANT}}"``) and a number stands on its own
(``BLOCK_N = {{BLOCK_N}}``).
"""

from __future__ import annotations

import re
from typing import Any

from ksearch_graph.tasks.task import Task, TemplateSpec

_PLACEHOLDER = re.compile(r"\{\{([A-Za-z_][A-Za-z0-9_]*)\}\}")


def _template(task: Task) -> TemplateSpec:
    if task.spec.template is None or task.template_source is None:
        raise ValueError(f"task {task.name} has no template")
    return task.spec.template


def default_params(task: Task) -> dict[str, Any]:
    return {name: p.default for name, p in _template(task).parameters.items()}


def render_template(task: Task, params: dict[str, Any]) -> dict[str, str]:
    """Return ``{solution_file: source}`` for ``params``; missing parameters take their defaults.

    Raises ValueError for an unknown parameter or a value outside the parameter's allowed list,
    so a planner cannot silently ask for a kernel the template does not describe.
    """
    spec = _template(task)
    unknown = sorted(set(params) - set(spec.parameters))
    if unknown:
        raise ValueError(f"unknown template parameters {unknown}; known: {sorted(spec.parameters)}")
    values = default_params(task) | params
    for name, value in values.items():
        allowed = spec.parameters[name].values
        if value not in allowed:
            raise ValueError(f"{name}={value!r} is not one of {allowed!r}")
    source = task.template_source
    for name, value in values.items():
        source = source.replace("{{" + name + "}}", str(value))
    leftover = sorted(set(_PLACEHOLDER.findall(source)))
    if leftover:
        raise ValueError(f"template {spec.file} has placeholders without a parameter: {leftover}")
    return {task.spec.solution_file: source}
