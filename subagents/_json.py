"""JSON encoding and decoding: the only module that imports orjson."""

from __future__ import annotations

from typing import TypeAlias

import orjson

__all__ = ["JSONValue", "dumps", "dumps_str", "loads"]

JSONValue: TypeAlias = "dict[str, JSONValue] | list[JSONValue] | str | int | float | bool | None"


def _default(value: object) -> object:
    # Tuples and frozensets reach us from frozen records; anything else is stringified
    # so that an event or envelope is always serialisable (nothing lost to a TypeError).
    if isinstance(value, (tuple, frozenset, set)):
        return list(value)
    return str(value)


def dumps(value: object) -> bytes:
    """Serialise ``value`` to compact UTF-8 JSON bytes (non-serialisable values as text)."""
    return orjson.dumps(value, default=_default)


def dumps_str(value: object) -> str:
    """Like :func:`dumps` but returns ``str``."""
    return orjson.dumps(value, default=_default).decode()


def loads(data: bytes | bytearray | memoryview | str) -> JSONValue:
    """Parse JSON text. Raises ``ValueError`` (``orjson.JSONDecodeError``) on bad input."""
    result: JSONValue = orjson.loads(data)
    return result
