"""MCP ``structuredContent``: a call's ``details`` cut to the bound its ``content`` got.

``details`` is for the host and may carry whole envelopes (a megabyte of output, a
thousand paths); an MCP client may hand ``structuredContent`` to a model, so
:meth:`ToolResult.to_mcp` sends a copy whose JSON text is no longer than the bound the
call's text was cut to. Only what the output schemas leave free is cut, so the copy stays
valid against them:

- a string longer than :data:`KEEP` characters keeps its start and its end around a
  marker saying how much was cut, as the text cuts an output;
- a ``files_changed`` list keeps its first paths and a last item saying how many more
  there were, as an envelope caps it.

Ids, names, statuses, numbers and flags are never cut (none the tools write is longer
than :data:`KEEP`): when they alone exceed the bound, the copy is as small as they allow.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Final, TypeAlias

from .._envelope import cut_middle
from .._json import JSONValue, dumps_str
from .._paths import MAX_NAME_LENGTH

__all__ = ["KEEP", "bounded_details", "water_fill"]

KEEP: Final = MAX_NAME_LENGTH
"""Characters of a string that are never cut: no task id, agent name or status is longer."""
_LISTS: Final = frozenset({"files_changed"})
"""Lists of paths, cut by items."""
_PASSES: Final = 8
"""Cuts are sized in characters and measured in JSON (escapes weigh more): a pass or two
more settles them; past this many passes nothing is left to cut."""

_MARKER_ROOM: Final = 48
"""JSON characters of the marker a cut string gets (with its two escaped newlines)."""
_MARK: Final = "[… "
_MORE: Final = " more paths]"

_Slot: TypeAlias = "tuple[dict[str, JSONValue] | list[JSONValue], str | int]"
"""Where a cuttable value sits: its container and its key or index."""


def bounded_details(details: dict[str, JSONValue], limit: int) -> dict[str, JSONValue]:
    """A copy of ``details`` whose JSON text is at most ``limit`` characters, or as small
    as its ids and numbers allow; ``details`` itself is not changed."""
    out = copy.deepcopy(details)
    for _ in range(_PASSES):
        excess = len(dumps_str(out)) - limit
        if excess <= 0:
            break
        slots = list(_cuttable(out))
        sizes = [len(dumps_str(_get(slot))) for slot in slots]
        shares = water_fill(sizes, max(sum(sizes) - excess, 0))
        changed = False
        for slot, size, share in zip(slots, sizes, shares, strict=True):
            if share < size:
                changed |= _cut(slot, size, share)
        if not changed:
            break
    return out


def water_fill(needs: list[int], budget: int) -> list[int]:
    """Share ``budget`` among items needing ``needs``: short ones get all they need, the
    rest split what is left evenly."""
    shares = [0] * len(needs)
    left = budget
    for rank, i in enumerate(sorted(range(len(needs)), key=lambda j: needs[j])):
        share = left // (len(needs) - rank)
        shares[i] = min(needs[i], share)
        left -= shares[i]
    return shares


def _cuttable(value: JSONValue) -> Iterator[_Slot]:
    """Every string longer than :data:`KEEP` and every list of paths in ``value``."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key in _LISTS and isinstance(item, list) and item:
                yield value, key
            else:
                yield from _inner(value, key, item)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _inner(value, index, item)


def _inner(
    container: dict[str, JSONValue] | list[JSONValue], key: str | int, item: JSONValue
) -> Iterator[_Slot]:
    if isinstance(item, str):
        if len(item) > KEEP:
            yield container, key
    else:
        yield from _cuttable(item)


def _get(slot: _Slot) -> JSONValue:
    container, key = slot
    if isinstance(container, list):
        assert isinstance(key, int)
        return container[key]
    assert isinstance(key, str)
    return container[key]


def _put(slot: _Slot, value: JSONValue) -> None:
    container, key = slot
    if isinstance(container, list):
        assert isinstance(key, int)
        container[key] = value
    else:
        assert isinstance(key, str)
        container[key] = value


def _cut(slot: _Slot, size: int, share: int) -> bool:
    """Cut the value at ``slot`` (``size`` characters of JSON) towards ``share``; whether
    it got shorter."""
    value = _get(slot)
    if isinstance(value, str):
        # Characters weigh what their escapes do: scale, leaving room for the marker.
        target = max((share - _MARKER_ROOM) * len(value) // size, KEEP)
        if target >= len(value):
            return False
        _put(slot, cut_middle(value, target))
        return True
    assert isinstance(value, list)
    earlier = _marker_count(value[-1])  # the envelope's own cap, or an earlier pass's
    paths = value[:-1] if earlier is not None else value
    kept = _paths_within(paths, share)
    shorter: list[JSONValue] = [
        *paths[:kept],
        f"{_MARK}{len(paths) - kept + (earlier or 0)}{_MORE}",
    ]
    if kept >= len(paths) or len(dumps_str(shorter)) >= size:  # the marker is no saving
        return False
    _put(slot, shorter)
    return True


def _paths_within(paths: list[JSONValue], share: int) -> int:
    """How many of ``paths`` fit in ``share`` characters of JSON with the marker."""
    used = len('["[… 0000 more paths]"]')
    for count, path in enumerate(paths):
        used += len(dumps_str(path)) + 1
        if used > share:
            return count
    return len(paths)


def _marker_count(item: JSONValue) -> int | None:
    """How many paths a last item ``[… N more paths]`` stands for (``None``: a path)."""
    if not isinstance(item, str) or not item.startswith(_MARK) or not item.endswith(_MORE):
        return None
    count = item[len(_MARK) : -len(_MORE)]
    return int(count) if count.isdigit() else None
