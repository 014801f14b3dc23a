"""JSON encoding and decoding: the only module that imports orjson."""

from __future__ import annotations

import json
import math
import re
from typing import Final, TypeAlias

import orjson

__all__ = ["JSONValue", "dumps", "dumps_str", "loads", "loads_exact"]

JSONValue: TypeAlias = "dict[str, JSONValue] | list[JSONValue] | str | int | float | bool | None"
_LONG_DIGITS: Final = re.compile(r"[0-9]{19}")
"""Digits enough for an integer beyond 64 bits, which orjson reads as a float (or
refuses): a text holding them is read again by the stdlib ``json``, exactly."""


def _default(value: object) -> object:
    # Tuples and frozensets reach us from frozen records; anything else is stringified
    # so that an event or envelope is always serialisable (nothing lost to a TypeError).
    if isinstance(value, (tuple, frozenset, set)):
        return list(value)
    return str(value)


def dumps(value: object) -> bytes:
    """Serialise ``value`` to compact UTF-8 JSON bytes (non-serialisable values as text;
    an integer beyond 64 bits exactly, where orjson refuses it)."""
    try:
        return orjson.dumps(value, default=_default)
    except orjson.JSONEncodeError as refused:
        return _exactly(value, refused)


def dumps_str(value: object) -> str:
    """Like :func:`dumps` but returns ``str``."""
    return dumps(value).decode()


def _exactly(value: object, refused: orjson.JSONEncodeError) -> bytes:
    """``value`` written by the stdlib, which writes the integers orjson refuses; for
    any other refusal (a lone surrogate, a key that is not text, a circle) orjson's
    error stands, so the fallback accepts nothing orjson would not but those integers."""
    if not _holds_big_int(value):
        raise refused
    try:
        text = json.dumps(
            value, default=_default, ensure_ascii=False, separators=(",", ":"), allow_nan=False
        )
        return text.encode()  # strict UTF-8: a lone surrogate is refused, as orjson does
    except (TypeError, ValueError, RecursionError):
        raise refused from None


_INT64: Final = range(-(2**63), 2**64)
"""The integers orjson writes (signed 64 bits, and unsigned up to 2**64 - 1)."""


def _holds_big_int(value: object, depth: int = 0) -> bool:
    """Whether ``value`` holds an integer orjson refuses: looked for only once orjson has
    refused ``value``, so a write that succeeds never pays for the walk. As deep as
    orjson goes (it refuses deeper values itself)."""
    if type(value) is int:
        return value not in _INT64
    if depth > 255:
        return False
    if isinstance(value, dict):  # a key that is not text orjson refuses for itself
        return all(type(k) is str for k in value) and any(
            _holds_big_int(v, depth + 1) for v in value.values()
        )
    if isinstance(value, list | tuple):
        return any(_holds_big_int(v, depth + 1) for v in value)
    return False


def loads(data: bytes | bytearray | memoryview | str) -> JSONValue:
    """Parse JSON text. Raises ``ValueError`` (``orjson.JSONDecodeError``) on bad input."""
    result: JSONValue = orjson.loads(data)
    return result


def loads_exact(text: str) -> JSONValue:
    """Like :func:`loads`, but an integer beyond 64 bits stays an exact ``int`` (orjson
    reads it as a float, or refuses it). Costs a regex search per text; one with 19
    digits in a row is parsed by the stdlib ``json`` (refusing NaN and infinities, as
    orjson does). Raises ``ValueError``, also for an integer over the interpreter's
    digit limit (4300 by default)."""
    try:
        value = loads(text)
    except ValueError:
        if _LONG_DIGITS.search(text) is None:
            raise
    else:
        if _LONG_DIGITS.search(text) is None:
            return value
    result: JSONValue = json.loads(text, parse_constant=_refused, parse_float=_finite)
    return result


def _refused(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text} is out of a float's range")
    return value
