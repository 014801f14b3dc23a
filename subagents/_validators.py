"""The argument checks every entry point shares: what "a number of seconds", "a count" and
"a text" mean, and the :class:`ConfigError` naming the field when a value is not one.

One definition, so a timeout means the same thing and fails the same way wherever it is
given (``spawn``, ``execute``, ``wait_result``, ``Mailbox``, the records, the tools).

Values are also made plain: a subclass of ``str``, ``int`` or ``float`` is copied through
the built-in type's own method, so none of its overrides (``__len__``, ``__eq__``,
``__float__``, ...) runs later where a failure could no longer be blamed on its giver.
"""

from __future__ import annotations

import math
import threading
from typing import Final, Literal, overload

from ._envelope import Usage, encodes
from ._envelope import plain_str as as_str
from ._errors import ConfigError

__all__ = [
    "MAX_COUNT",
    "MAX_IDEMPOTENCY_KEY",
    "as_count",
    "as_int",
    "as_str",
    "count",
    "idempotency_key",
    "number",
    "plain_usage",
    "seconds",
    "text",
    "thread_wait",
    "texts",
]

MAX_COUNT: Final = 2**63 - 1
"""Counts travel as JSON integers; orjson (and most consumers) stop at 64 bits."""

MAX_IDEMPOTENCY_KEY: Final = 256
"""Characters of an idempotency key: room for a UUID and a prefix, bounded so an index
entry (and a tool argument) stays small."""


def as_int(value: object) -> int | None:
    """``value`` as a plain ``int`` (a bool is not one), or ``None``."""
    kind = type(value)
    if kind is int:
        return value  # type: ignore[return-value]
    if issubclass(kind, int) and kind is not bool:
        return int.__index__(value)  # type: ignore[arg-type]
    return None


def as_count(value: object, maximum: int = MAX_COUNT) -> int | None:
    """``value`` as a plain ``int`` in ``0..maximum``, or ``None`` if it is not one."""
    number = as_int(value)
    return number if number is not None and 0 <= number <= maximum else None


def plain_usage(value: object) -> Usage | None:
    """``value`` as a plain :class:`Usage` (token counts 0 <= n < 2**63), or ``None`` if it
    is not one. A subclass (whose ``__bool__`` or ``__add__`` may raise) is rebuilt."""
    if not issubclass(type(value), Usage):
        return None
    usage: Usage = value  # type: ignore[assignment]
    tokens_in = as_count(usage.input_tokens)
    tokens_out = as_count(usage.output_tokens)
    if tokens_in is None or tokens_out is None:
        return None
    plain = tokens_in is usage.input_tokens and tokens_out is usage.output_tokens
    if plain and type(usage) is Usage:
        return usage
    return Usage(input_tokens=tokens_in, output_tokens=tokens_out)


def usage(field: str, value: object) -> Usage:
    """``value`` as a plain :class:`Usage`, else a :class:`ConfigError` naming ``field``."""
    plain = plain_usage(value)
    if plain is None:
        raise ConfigError(field, "a Usage with token counts 0 <= n < 2**63", value)
    return plain


def _as_float(value: object) -> float | None:
    """``value`` as a plain finite ``float``, or ``None``: not a real number, NaN, infinite,
    or an integer too large for a float (``10**400``)."""
    kind = type(value)
    try:
        if issubclass(kind, float):
            number = float.__float__(value)  # type: ignore[arg-type]
        elif issubclass(kind, int) and kind is not bool:
            number = int.__float__(value)  # type: ignore[arg-type]
        else:
            return None
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


@overload
def seconds(field: str, value: object, *, none_ok: Literal[False], zero_ok: bool) -> float: ...


@overload
def seconds(field: str, value: object, *, none_ok: bool, zero_ok: bool) -> float | None: ...


def seconds(field: str, value: object, *, none_ok: bool, zero_ok: bool) -> float | None:
    """``value`` as float seconds: a finite real number > 0 (>= 0 with ``zero_ok``), or
    ``None`` (no limit) with ``none_ok``. ``-0.0`` comes back as ``0.0``.

    ``inf`` is refused: ``None`` is the one spelling of "no limit", so every consumer (a
    deadline, the tools' ``timeout_ms``, a JSON event) gets a finite number or ``None``.

    Raises:
        ConfigError: ``field`` is a bool, a string, NaN, infinite, negative (or zero), or an
            integer too large for a float.
    """
    if value is None and none_ok:
        return None
    number = _as_float(value)
    if number is None or number < 0 or (number == 0 and not zero_ok):
        expected = f"a finite number of seconds {'>= 0' if zero_ok else '> 0'}"
        raise ConfigError(field, expected + (" or None" if none_ok else ""), value)
    return 0.0 if number == 0 else number  # -0.0 is zero, and never printed "-0"


def thread_wait(field: str, value: object, *, zero_ok: bool) -> float:
    """:func:`seconds` that a thread waits for (a lock, a condition, a connection's busy
    timeout): at most ``threading.TIMEOUT_MAX``, beyond which the wait itself raises.

    Raises:
        ConfigError: as :func:`seconds`, or longer than a thread can wait.
    """
    number = seconds(field, value, none_ok=False, zero_ok=zero_ok)
    if number > threading.TIMEOUT_MAX:
        limit = f"a number of seconds a thread can wait for (at most {threading.TIMEOUT_MAX:g})"
        raise ConfigError(field, limit, value)
    return number


def number(field: str, value: object) -> float:
    """``value`` as a plain finite float >= 0: a factor, a backoff bound.

    Raises:
        ConfigError: ``field`` is not a finite real number >= 0.
    """
    result = _as_float(value)
    if result is None or result < 0:
        raise ConfigError(field, "a finite number >= 0", value)
    return result


@overload
def count(field: str, value: object, *, minimum: int, none_ok: Literal[False] = ...) -> int: ...


@overload
def count(field: str, value: object, *, minimum: int, none_ok: bool) -> int | None: ...


def count(
    field: str, value: object, *, minimum: int, none_ok: bool = False, maximum: int = MAX_COUNT
) -> int | None:
    """``value`` as a plain int in ``minimum..maximum`` (``None`` with ``none_ok``).

    Raises:
        ConfigError: ``field`` is not such an integer (a bool is not one).
    """
    if value is None and none_ok:
        return None
    result = as_int(value)
    if result is None or not minimum <= result <= maximum:
        expected = f"an integer >= {minimum}"
        if result is not None and result > maximum:
            expected += " and < 2**63" if maximum == MAX_COUNT else f" and <= {maximum}"
        raise ConfigError(field, expected + (" or None" if none_ok else ""), value)
    return result


def text(field: str, value: object) -> str:
    """``value`` as a plain ``str``.

    Raises:
        ConfigError: ``field`` is not a string.
    """
    result = as_str(value)
    if result is None:
        raise ConfigError(field, "a string", value)
    return result


def texts(field: str, value: object) -> tuple[str, ...]:
    """A path (one ``str``) or an iterable of them, as a tuple of plain ``str``.

    Raises:
        ConfigError: ``field`` is not a string or an iterable of strings (including when
            iterating it fails).
    """
    single = as_str(value)
    if single is not None:
        return (single,)
    try:
        items: tuple[object, ...] = tuple(value)  # type: ignore[arg-type]
    except Exception:
        raise ConfigError(field, "a string or an iterable of strings", value) from None
    plain = tuple(as_str(item) for item in items)
    if None in plain:
        raise ConfigError(field, "paths given as strings", value)
    return plain  # type: ignore[return-value]


def idempotency_key(value: object) -> str:
    """``value`` as a spawn's idempotency key: a plain ``str`` of 1 to
    :data:`MAX_IDEMPOTENCY_KEY` characters.

    Raises:
        ConfigError: ``idempotency_key`` is not such a string.
    """
    key = as_str(value)
    if key is None or not 0 < len(key) <= MAX_IDEMPOTENCY_KEY or not encodes(key):
        expected = (
            f"a non-empty string of at most {MAX_IDEMPOTENCY_KEY} characters, encodable as "
            "UTF-8, or None"
        )
        raise ConfigError("idempotency_key", expected, value)
    return key
