"""Tool definitions in the shapes the model providers document.

* OpenAI Chat Completions: ``{"type": "function", "function": {"name", "description",
  "parameters", "strict"}}``.
* OpenAI Responses: ``{"type": "function", "name", "description", "parameters",
  "strict"}`` (flat; ``strict`` is a required field there).
* Anthropic Messages: ``{"name", "description", "input_schema"}``.
* MCP ``tools/list``: ``{"name", "title", "description", "inputSchema", "outputSchema",
  "annotations"}``.

``strict=True`` (OpenAI) rewrites the schema the way OpenAI's strict mode demands: every
property listed in ``required`` (a nested object's too), optional ones nullable (the input
schemas already say so), keywords strict mode does not support (``minLength``,
``maxLength``, ``default``) dropped (``pattern`` stays); the tools treat ``null`` as
omitted and still check everything, so both forms are accepted at execution time.
"""

from __future__ import annotations

import copy
from typing import Final, Protocol

from .._json import JSONValue

__all__ = ["Described", "to_anthropic", "to_mcp", "to_openai_chat", "to_openai_responses"]


class Described(Protocol):
    """What an exporter reads of a tool: :class:`~subagents.tools.Tool`'s own methods call
    the exporters, which therefore name no class of the tools."""

    @property
    def name(self) -> str: ...
    @property
    def title(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def input_schema(self) -> dict[str, JSONValue]: ...
    @property
    def output_schema(self) -> dict[str, JSONValue]: ...
    @property
    def annotations(self) -> dict[str, bool]: ...


# Keywords OpenAI's strict mode does not document as supported (strings take only
# ``pattern`` and ``format``); the tools still check them at execution time.
_NOT_STRICT: Final = ("minLength", "maxLength", "default")


def _drop_unsupported(node: JSONValue) -> None:
    if isinstance(node, dict):
        for key in _NOT_STRICT:
            node.pop(key, None)
        for value in node.values():
            _drop_unsupported(value)
    elif isinstance(node, list):
        for item in node:
            _drop_unsupported(item)


def _nullable(prop: dict[str, JSONValue]) -> bool:
    any_of = prop.get("anyOf")
    kind = prop.get("type")
    if isinstance(any_of, list):
        return {"type": "null"} in any_of
    return kind == "null" or (isinstance(kind, list) and "null" in kind)


def _strict(schema: dict[str, JSONValue]) -> dict[str, JSONValue]:
    out = copy.deepcopy(schema)
    out.pop("$schema", None)
    _drop_unsupported(out)
    props = out.get("properties")
    required = out.get("required")
    assert isinstance(props, dict)
    assert isinstance(required, list)
    for name, prop in props.items():
        if name in required or not isinstance(prop, dict) or _nullable(prop):
            continue
        any_of = prop.get("anyOf")
        enum = prop.get("enum")
        if isinstance(any_of, list):
            prop["anyOf"] = [*any_of, {"type": "null"}]
        elif isinstance(prop.get("type"), str):
            prop["type"] = [prop["type"], "null"]
            if isinstance(enum, list):
                prop["enum"] = [*enum, None]
    out["required"] = list(props)
    _require_nested(props)
    return out


def _require_nested(node: JSONValue) -> None:
    """Strict mode asks the same of a nested object: every property listed in
    ``required`` (the tools' nested fields are all nullable already)."""
    if isinstance(node, dict):
        nested = node.get("properties")
        if isinstance(nested, dict) and node.get("type") == "object":
            node["required"] = list(nested)
        for value in node.values():
            _require_nested(value)
    elif isinstance(node, list):
        for item in node:
            _require_nested(item)


def _parameters(tool: Described, strict: bool) -> dict[str, JSONValue]:
    return _strict(tool.input_schema) if strict else copy.deepcopy(tool.input_schema)


def to_openai_chat(tool: Described, *, strict: bool = False) -> dict[str, JSONValue]:
    """The Chat Completions ``tools[]`` entry of ``tool``."""
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": _parameters(tool, strict),
            "strict": strict,
        },
    }


def to_openai_responses(tool: Described, *, strict: bool = False) -> dict[str, JSONValue]:
    """The Responses API ``tools[]`` entry of ``tool``."""
    return {
        "type": "function",
        "name": tool.name,
        "description": tool.description,
        "parameters": _parameters(tool, strict),
        "strict": strict,
    }


def to_anthropic(tool: Described) -> dict[str, JSONValue]:
    """The Anthropic Messages ``tools[]`` entry of ``tool``."""
    return {
        "name": tool.name,
        "description": tool.description,
        "input_schema": copy.deepcopy(tool.input_schema),
    }


def to_mcp(tool: Described) -> dict[str, JSONValue]:
    """The MCP ``tools/list`` descriptor of ``tool`` (behaviour hints in ``annotations``;
    ``outputSchema`` describes the ``structuredContent`` of its results)."""
    return {
        "name": tool.name,
        "title": tool.title,
        "description": tool.description,
        "inputSchema": copy.deepcopy(tool.input_schema),
        "outputSchema": copy.deepcopy(tool.output_schema),
        "annotations": {"title": tool.title, **tool.annotations},
    }
