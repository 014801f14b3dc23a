"""Tool input validation: one declaration per parameter gives both the JSON Schema a model
reads and the checks its arguments go through, so the two can never disagree.

Every failure is an :class:`ArgumentError` whose message names the field, what was
expected and what came (``timeout_ms must be an integer >= 0, got -5``), so a model can
correct its call.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping, Sequence
from typing import Final, Literal

import attrs

from .._json import JSONValue, dumps_str, loads

__all__ = ["MAX_INT", "SCHEMA_DIALECT", "ArgumentError", "Param", "ms", "parse_args", "schema_for"]

SCHEMA_DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"
MAX_INT: Final = 2**53 - 1
"""Largest integer a JSON number carries exactly; larger integer arguments are clamped to it."""
_SHOW_CHARS: Final = 80


def ms(seconds: float) -> int:
    """Seconds (finite, >= 0) as integer milliseconds for an answer, clamped to
    :data:`MAX_INT` like every integer the tools take, so a huge timeout or budget stays
    a JSON integer (``seconds * 1000`` of a large float is infinite: no ``int`` of it)."""
    value = seconds * 1000
    return MAX_INT if value >= MAX_INT else int(value)


Kind = Literal["string", "integer", "boolean", "ids", "enum", "object"]


class ArgumentError(ValueError):
    """A tool argument is missing, unknown or malformed; the message is for a model."""

    def __init__(self, message: str, field: str | None = None) -> None:
        self.field = field
        super().__init__(message)


@attrs.frozen(kw_only=True)
class Param:
    """One tool parameter: its schema and its check."""

    name: str
    """The field name."""
    kind: Kind
    """``string``, ``integer``, ``boolean``, ``enum`` (a string from ``choices``), ``ids``
    (a task id string or a non-empty list of them) or ``object`` (of the optional
    ``fields``)."""
    description: str
    """What the field means, for a model."""
    required: bool = False
    """Whether the call must carry the field."""
    minimum: int = 0
    """Lower bound of an ``integer``."""
    choices: tuple[str, ...] = ()
    """The allowed values of an ``enum``."""
    default: str | int | bool | None = None
    """Documented default (schema only; the tool applies it)."""
    max_items: int = 64
    """Upper bound on the number of ids of an ``ids`` field."""
    min_length: int = 0
    """Lower bound on the characters of a ``string`` (each id of an ``ids`` field has 1)."""
    max_length: int | None = None
    """Upper bound on the characters of a ``string`` (of each id of an ``ids`` field)."""
    pattern: str | None = None
    """Regex a ``string`` (each id of an ``ids`` field) must match: anchored ``^...$``, in
    the subset where ECMA-262 (JSON Schema's dialect) search and Python's
    ``re.fullmatch`` agree, with no lookaround (some providers refuse it)."""
    form: str = ""
    """What ``max_length`` and ``pattern`` ask for, in words, for the error message."""
    fields: tuple[Param, ...] = ()
    """The fields of an ``object``, each optional (``null`` counts as omitted); no other
    key is accepted."""
    content: bool = False
    """The value is conversation content (a message body): an error gives its length,
    never its text, which would reach spans and logs without ``capture_content``."""


def schema_for(params: Sequence[Param]) -> dict[str, JSONValue]:
    """The JSON Schema (draft 2020-12) of an object with ``params`` and nothing else.

    It accepts exactly what :func:`parse_args` accepts: an optional field may also be
    ``null`` (taken as omitted, as OpenAI's strict mode sends it) and integers have no
    upper bound (larger values are clamped)."""
    properties: dict[str, JSONValue] = {}
    for p in params:
        prop: dict[str, JSONValue]
        if p.kind == "string":
            prop = _string(p, min_length=p.min_length)
        elif p.kind == "integer":
            prop = {"type": "integer", "minimum": p.minimum}
        elif p.kind == "boolean":
            prop = {"type": "boolean"}
        elif p.kind == "enum":
            prop = {"type": "string", "enum": list(p.choices)}
        elif p.kind == "object":
            inner = schema_for(p.fields)
            prop = {
                "type": "object",
                "properties": inner["properties"],
                "required": [],
                "additionalProperties": False,
            }
        else:
            item = _string(p, min_length=1)
            prop = {
                "anyOf": [
                    item,
                    {"type": "array", "items": item, "minItems": 1, "maxItems": p.max_items},
                ]
            }
        if not p.required:
            prop = {"anyOf": [*_alternatives(prop), {"type": "null"}]}
        prop["description"] = p.description
        if p.default is not None:
            prop["default"] = p.default
        properties[p.name] = prop
    return {
        "$schema": SCHEMA_DIALECT,
        "type": "object",
        "properties": properties,
        "required": [p.name for p in params if p.required],
        "additionalProperties": False,
    }


def _string(p: Param, *, min_length: int = 0) -> dict[str, JSONValue]:
    out: dict[str, JSONValue] = {"type": "string"}
    if min_length:
        out["minLength"] = min_length
    if p.max_length is not None:
        out["maxLength"] = p.max_length
    if p.pattern is not None:
        out["pattern"] = p.pattern
    return out


def _alternatives(prop: dict[str, JSONValue]) -> list[JSONValue]:
    any_of = prop.get("anyOf")
    return list(any_of) if isinstance(any_of, list) and len(prop) == 1 else [prop]


def show(value: object) -> str:
    """A short rendering of a received value for an error message."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    try:
        text = dumps_str(value)
    except Exception:
        text = repr(value)
    if len(text) > _SHOW_CHARS:
        text = text[: _SHOW_CHARS - 1] + "…"
    if isinstance(value, str):
        return f"{text} (a string)"
    if isinstance(value, bool):
        return f"{text} (a boolean)"
    if isinstance(value, list):
        return f"{text} (an array)"
    if isinstance(value, dict):
        return f"{text} (an object)"
    return text


def parse_args(tool: str, params: Sequence[Param], args: object) -> dict[str, object]:
    """Check ``args`` (an object, or its JSON text) against ``params``.

    Returns the fields that were given, normalised: integers as ``int``, ``ids`` as a
    de-duplicated ``list[str]``. ``None`` counts as ``{}``; a field whose value is
    ``null`` counts as omitted (OpenAI's strict mode sends optional fields that way).

    Raises:
        ArgumentError: the first problem found, named for a model.
    """
    fields = _as_object(tool, args)
    by_name = {p.name: p for p in params}
    for key in fields:
        if not isinstance(key, str) or key not in by_name:
            raise _unknown_field(tool, key, list(by_name))
    out: dict[str, object] = {}
    for p in params:
        value = fields.get(p.name)
        if value is None:
            if p.required:
                raise ArgumentError(f"{p.name} is required: {p.description}", p.name)
            continue
        out[p.name] = _check(p, value)
    return out


def _as_object(tool: str, args: object) -> Mapping[object, object]:
    """``args`` as a mapping: ``None`` as ``{}``, UTF-8 bytes and JSON text parsed (blank
    text as ``{}``)."""
    if args is None:
        return {}
    if isinstance(args, (bytes, bytearray)):
        try:
            args = args.decode("utf-8")
        except UnicodeDecodeError:
            raise ArgumentError(f"{tool} arguments must be UTF-8 JSON text") from None
    if isinstance(args, str):
        try:
            args = loads(args) if args.strip() else {}
        except ValueError:
            raise ArgumentError(
                f"{tool} arguments must be a JSON object, got text that is not JSON: {show(args)}"
            ) from None
    if not isinstance(args, Mapping):
        raise ArgumentError(f"{tool} arguments must be a JSON object, got {show(args)}")
    return args


def _unknown_field(tool: str, key: object, names: list[str]) -> ArgumentError:
    """The error for a field ``key`` that is none of ``names``, with the closest name."""
    allowed = ", ".join(names) if names else "(none: call it with {})"
    hint = ""
    if isinstance(key, str):
        close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
        if close:
            hint = f" (did you mean {close[0]!r}?)"
    shown = repr(key[:_SHOW_CHARS]) if isinstance(key, str) else show(key)
    # The field goes into JSON details: bounded, and a lone surrogate escaped.
    field = str(key)[:_SHOW_CHARS].encode("utf-8", "backslashreplace").decode("utf-8")
    return ArgumentError(
        f"unknown field {shown} for {tool}{hint}; allowed fields: {allowed}", field
    )


def _check(p: Param, value: object) -> object:
    if p.kind == "string":
        return _constrained(p, _text(p.name, value, "a string"), p.name)
    if p.kind == "enum":
        expected = "one of " + ", ".join(repr(c) for c in p.choices)
        if not isinstance(value, str) or value not in p.choices:
            raise ArgumentError(f"{p.name} must be {expected}, got {show(value)}", p.name)
        return value
    if p.kind == "object":
        return _object(p, value)
    if p.kind == "integer":
        return _integer(p, value)
    if p.kind == "boolean":
        if not isinstance(value, bool):
            raise ArgumentError(f"{p.name} must be true or false, got {show(value)}", p.name)
        return value
    # ids: one id or a list of them
    expected = f"a task id string or a non-empty array of at most {p.max_items} of them"
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or len(items) > p.max_items:
        raise ArgumentError(f"{p.name} must be {expected}, got {show(value)}", p.name)
    ids: dict[str, None] = {}
    for item in items:
        text = _text(p.name, item, expected)
        if not text:
            raise ArgumentError(f"{p.name} must not contain an empty task id", p.name)
        ids[_constrained(p, text, f"every id in {p.name}")] = None
    return list(ids)


def _integer(p: Param, value: object) -> int:
    """``value`` as an integer >= ``p.minimum`` (an integral float taken as one), clamped
    to :data:`MAX_INT`."""
    expected = f"an integer >= {p.minimum}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ArgumentError(f"{p.name} must be {expected}, got {show(value)}", p.name)
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise ArgumentError(f"{p.name} must be {expected}, got {show(value)}", p.name)
        value = int(value)
    if value < p.minimum:
        raise ArgumentError(f"{p.name} must be {expected}, got {show(value)}", p.name)
    return min(value, MAX_INT)


def _object(p: Param, value: object) -> dict[str, object]:
    """``value`` checked as an object of ``p.fields``; a field's problem is named
    ``<p.name>.<field>`` (the error's ``field`` is ``p.name``)."""
    names = [f.name for f in p.fields]
    if not isinstance(value, dict):
        raise ArgumentError(
            f"{p.name} must be an object with the optional fields {', '.join(names)}, "
            f"got {show(value)}",
            p.name,
        )
    try:
        return parse_args(p.name, p.fields, value)
    except ArgumentError as exc:
        text = str(exc)
        if exc.field in names:
            text = f"{p.name}.{text}"  # "budget.tokens must be an integer >= 0, got -1"
        raise ArgumentError(text, p.name) from None


def _constrained(p: Param, value: str, what: str) -> str:
    """``value`` if it meets ``p.min_length``, ``p.max_length`` and ``p.pattern``; the
    message names ``what`` (the field, or its items)."""
    too_long = p.max_length is not None and len(value) > p.max_length
    unmatched = p.pattern is not None and not re.fullmatch(p.pattern, value)
    if too_long or len(value) < p.min_length or unmatched:
        got = f"{len(value)} characters" if p.content else show(value)
        raise ArgumentError(f"{what} must be {p.form}, got {got}", p.name)
    return value


def _text(field: str, value: object, expected: str) -> str:
    if not isinstance(value, str):
        raise ArgumentError(f"{field} must be {expected}, got {show(value)}", field)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ArgumentError(
            f"{field} must be valid Unicode text; it has an unpaired surrogate at "
            f"position {exc.start}",
            field,
        ) from None
    return value
