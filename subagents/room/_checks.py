"""The checks of a room call's arguments: each bad value is a ``ConfigError`` naming its
field."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Final

from .._errors import ConfigError
from .._validators import as_int, seconds
from ..store._sqlite import Synchronous
from ._members import absolute, check_name
from ._messages import MAX_BODY, MAX_SUBJECT
from ._records import LeaseMode

__all__ = [
    "absolute",
    "MAX_LIMIT",
    "check_body",
    "check_cwd",
    "check_limit",
    "check_mode",
    "check_path",
    "check_pid",
    "check_rooms",
    "check_selector",
    "check_subject",
    "check_synchronous",
    "check_tags",
    "check_ttl",
]

MAX_LIMIT: Final = 1000
"""The most rows one call returns."""
MAX_PATH: Final = 4096


MAX_PID: Final = 2**31 - 1
"""The largest pid a kernel gives (``pid_t`` is a signed 32-bit int)."""


def check_rooms(room: object, extra: object) -> tuple[str, ...]:
    if isinstance(extra, str) or not isinstance(extra, Sequence):
        raise ConfigError("extra_rooms", "a list of room names (not one string)", extra)
    rooms = [check_name("room", room), *(check_name("extra_rooms", r) for r in extra)]
    return tuple(dict.fromkeys(rooms))


def check_tags(tags: Sequence[object] | None) -> tuple[str, ...] | None:
    if tags is None:
        return None
    if isinstance(tags, str):
        raise ConfigError("tags", "a list of tags (not one string)", tags)
    return tuple(dict.fromkeys(check_name("tags", t) for t in tags))


def check_ttl(field: str, value: object, *, none_ok: bool) -> float | None:
    return seconds(field, value, none_ok=none_ok, zero_ok=False)


def check_limit(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LIMIT:
        raise ConfigError("limit", f"an integer from 1 to {MAX_LIMIT}", value)
    return value


MAX_IDS: Final = 1000
"""Message ids one :meth:`Room.mark_read` or :meth:`Room.accept` call takes at most."""


def check_ids(value: object) -> tuple[int, ...]:
    """``value`` as message ids (a list of ints, at most :data:`MAX_IDS`)."""
    expected = f"a list of at most {MAX_IDS} message ids (ints >= 1)"
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ConfigError("message_ids", expected, value)
    if len(value) > MAX_IDS:
        raise ConfigError("message_ids", expected + f" (it has {len(value)})", value)
    ids = tuple(as_int(v) for v in value)
    if any(i is None or i < 1 for i in ids):
        raise ConfigError("message_ids", expected, value)
    return tuple(i for i in ids if i is not None)


def check_mode(value: object) -> LeaseMode:
    if value == "exclusive" or value == "shared":
        return value
    raise ConfigError("mode", "'exclusive' or 'shared'", value)


def check_path(value: object) -> str:
    if not isinstance(value, str) or not value or "\0" in value or len(value) > MAX_PATH:
        raise ConfigError("path", f"a file path (1 to {MAX_PATH} characters, no NUL)", value)
    return value


def check_selector(value: object) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_PATH:
        raise ConfigError("to", "'*', a member id, 'file:<glob>' or 'tag:<tag>'", value)
    return value


def check_body(value: object) -> str:
    if not isinstance(value, str) or len(value) > MAX_BODY:
        raise ConfigError("body", f"a string of at most {MAX_BODY} characters", value)
    return value


def check_subject(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_SUBJECT:
        raise ConfigError("subject", f"a string of at most {MAX_SUBJECT} characters", value)
    return value


def check_pid(value: object) -> int | None:
    """A pid (a positive int; ``None``: no pid recorded)."""
    if value is None:
        return None
    pid = as_int(value)
    if pid is None or not 1 <= pid <= MAX_PID:
        raise ConfigError("pid", f"a process id (an integer from 1 to {MAX_PID}) or None", value)
    return pid


def check_cwd(value: object) -> str | None:
    """A working directory (``None``: this process's)."""
    if value is None:
        return None
    if not isinstance(value, str | os.PathLike):
        raise ConfigError("cwd", "a directory path (a string)", value)
    path = os.fspath(value)
    if not isinstance(path, str) or not path or "\0" in path or len(path) > MAX_PATH:
        raise ConfigError("cwd", f"a directory path (1 to {MAX_PATH} characters, no NUL)", value)
    return path


def check_synchronous(value: object) -> Synchronous:
    if value == "FULL" or value == "NORMAL":
        return value
    raise ConfigError("synchronous", "'FULL' or 'NORMAL'", value)
