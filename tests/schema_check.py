"""Checks of tool results against their tools' output schemas (jsonschema as the judge)."""

from __future__ import annotations

import copy
from typing import Any

from jsonschema import Draft202012Validator

from subagents._json import dumps
from subagents.tools import Tool
from subagents.typing import JSONValue

_VALIDATORS: dict[tuple[bytes, bool], Draft202012Validator] = {}


def closed(schema: Any) -> Any:
    """``schema`` with every listed object closed (``additionalProperties: false``): valid
    details then use only properties the schema names."""
    out = copy.deepcopy(schema)
    stack = [out]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "properties" in node:
                node["additionalProperties"] = False
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return out


def output_validator(tool: Tool, *, complete: bool = False) -> Draft202012Validator:
    """The validator of ``tool``'s output schema (``complete``: closed, see :func:`closed`)."""
    key = (dumps(tool.output_schema), complete)
    validator = _VALIDATORS.get(key)
    if validator is None:
        schema = closed(tool.output_schema) if complete else tool.output_schema
        Draft202012Validator.check_schema(schema)
        validator = _VALIDATORS[key] = Draft202012Validator(schema)
    return validator


def details_problems(
    tool: Tool, details: dict[str, JSONValue], *, complete: bool = False
) -> list[str]:
    """Why ``details`` do not match ``tool``'s output schema (empty: they do)."""
    validator = output_validator(tool, complete=complete)
    return [
        f"{tool.name}: {error.message} at {list(error.absolute_path)}"
        for error in validator.iter_errors(details)
    ]
