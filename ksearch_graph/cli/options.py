"""CLI options that set a settings field take their default, help and checks from the pydantic model.

``SearchConfig``, ``Budget`` and ``LLMSettings`` are the one source: a flag's default is the field's default,
and a value outside the field's bounds is an argparse usage error (exit code 2), never a traceback later.
"""

from __future__ import annotations

import argparse
import types
import typing
from typing import Annotated, Any, Literal

from pydantic import BaseModel, TypeAdapter, ValidationError


def model_option(model: type[BaseModel], field: str, *, help: str | None = None, default: Any = ...,
                 **kwargs: Any) -> dict[str, Any]:
    """``add_argument`` keywords for an option setting ``model.field`` (``default=None``: leave the run's value)."""
    info = model.model_fields[field]
    base = _scalar(info.annotation)
    value = info.default if default is ... else default
    words = help or info.description or field.replace("_", " ")
    if value is not None:
        words += " (default %(default)s)"
    if typing.get_origin(base) is Literal:
        return {"choices": list(typing.get_args(base)), "default": value, "help": words, **kwargs}
    return {"type": checked(model, field), "default": value, "help": words, "metavar": base.__name__.upper(),
            **kwargs}


def checked(model: type[BaseModel], field: str):
    """An argparse ``type`` converting a string and checking it against ``model.field``'s constraints."""
    info = model.model_fields[field]
    base = _scalar(info.annotation)
    adapter = TypeAdapter(Annotated[base, *info.metadata]) if info.metadata else TypeAdapter(base)

    def parse(text: str):
        try:
            value = base(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if base is int else 'a number'}") from None
        try:
            return adapter.validate_python(value)
        except ValidationError as e:
            raise argparse.ArgumentTypeError(f"{text}: {e.errors()[0]['msg'].lower()}") from None

    parse.__name__ = base.__name__  # argparse names the type in its messages
    return parse


def _scalar(annotation: Any) -> Any:
    """``int | None`` -> int; other annotations as they are."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0]
    return annotation
