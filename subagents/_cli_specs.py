"""``--agents MODULE:NAME``: the agent specs a command line runs, found in the user's code.

``NAME`` (an attribute, dotted for a nested one) is an :class:`~subagents.AgentSpec`, a
list or tuple of them, a mapping whose values are, or a function of no arguments returning
one of those (a factory, so building the specs can wait until the command runs). The
module is imported as ``python -m`` would: from the current directory first.

A factory is a plain function: an ``async def`` one is refused, since the specs are built
before the command's event loop starts. What the user's code prints while it is imported
or called goes to stderr: over stdio, stdout is the MCP protocol's channel.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import sys
from collections.abc import Mapping
from contextlib import redirect_stdout

from ._envelope import describe_exception
from ._spec import AgentSpec

__all__ = ["SpecsError", "load_specs", "specs_reference"]


class SpecsError(Exception):
    """``--agents`` names no usable specs; the message says why, in one line."""


def specs_reference(text: str) -> str:
    """An argparse ``type``: ``text`` if it has the ``MODULE:NAME`` form."""
    module, colon, name = text.partition(":")
    if not colon or not module.strip() or not name.strip():
        raise argparse.ArgumentTypeError(
            f"expected MODULE:NAME (for example myagents:SPECS), got {text!r}"
        )
    return text


def load_specs(reference: str) -> list[AgentSpec]:
    """The specs ``reference`` (``MODULE:NAME``) names. Whatever the module prints while it
    is imported, or the factory while it runs, goes to stderr.

    Raises:
        SpecsError: the module cannot be imported (its exception named), has no such
            attribute, or the attribute is not specs (nor a plain function returning them),
            or is empty.
    """
    module_name, _, name = specs_reference(reference).partition(":")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does: the user's own modules first
    with redirect_stdout(sys.stderr):
        value = _resolve(reference, module_name, name)
    return _specs(reference, value)


def _resolve(reference: str, module_name: str, name: str) -> object:
    """What ``MODULE:NAME`` names: the attribute, or what its factory returns."""
    try:
        value: object = importlib.import_module(module_name)
    except Exception as exc:
        raise SpecsError(f"cannot import {module_name!r}: {describe_exception(exc)[1]}") from exc
    for part in name.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise SpecsError(f"{reference}: {part!r} not found") from None
    if not callable(value) or isinstance(value, AgentSpec):
        return value
    if inspect.iscoroutinefunction(value):
        raise SpecsError(f"{reference} is an async function: the factory must be a plain one")
    try:
        value = value()
    except Exception as exc:
        raise SpecsError(f"{reference}() raised {describe_exception(exc)[1]}") from exc
    if inspect.isawaitable(value):
        if inspect.iscoroutine(value):
            value.close()  # never awaited: closed here, so it warns of nothing
        raise SpecsError(f"{reference}() returned an awaitable: the factory must be a plain one")
    return value


def _specs(reference: str, value: object) -> list[AgentSpec]:
    if isinstance(value, AgentSpec):
        return [value]
    if isinstance(value, Mapping):
        value = list(value.values())
    if not isinstance(value, (list, tuple)):
        raise SpecsError(
            f"{reference} is of type {type(value).__name__}, not an AgentSpec, a list of them, a "
            "mapping of them or a function returning one of those"
        )
    for index, item in enumerate(value):
        if not isinstance(item, AgentSpec):
            raise SpecsError(
                f"{reference}[{index}] is of type {type(item).__name__}, not an AgentSpec"
            )
    if not value:
        raise SpecsError(f"{reference} holds no AgentSpec: there would be nothing to run")
    return list(value)
