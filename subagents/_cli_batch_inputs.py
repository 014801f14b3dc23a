"""``subagents batch run --input``: the items of a JSONL or CSV file (or stdin), with ids.

Read once, whole, before anything runs: duplicate ids are found before the first item
starts, and the total is known for the progress bar. Each item keeps its line number as
an editor shows it (a CSV's header is line 1, so its first row is line 2; a record over
several lines is numbered by its first; blank lines count and are skipped). Only ``\n``
ends a line (``\r\n`` too): JSON allows U+2028 or U+0085 raw inside a string. In a CSV a
bare ``\r`` that ends a record (classic Mac endings, as the ``csv`` module reads them)
ends a line too; one inside a quoted cell does not. Bytes that are not UTF-8 make their
line (or CSV record) malformed, not the input. A JSONL integer stays exact at any size.
"""

from __future__ import annotations

import csv
import io
import re
import sys
from collections.abc import Iterator
from typing import Final, Literal

import attrs

from ._json import loads_exact

__all__ = ["Item", "Items", "InputError", "read_items"]

Format = Literal["jsonl", "csv"]
_LISTED: Final = 10
"""A duplicate-id error lists this many ids (each with its lines)."""
_CELL_LIMIT: Final = 2**31 - 1
"""The largest CSV cell (``csv`` refuses cells over 128 KiB by default); the whole input
is in memory anyway."""
_NOT_UTF8: Final = re.compile("[\udc80-\udcff]")
"""What ``surrogateescape`` decodes a byte that is not UTF-8 to."""
_WHY_NOT_UTF8: Final = "not UTF-8"


class InputError(Exception):
    """The input cannot be run: a usage error (exit status 2); the message is one line."""


@attrs.frozen(kw_only=True)
class Item:
    """One task of the batch."""

    id: str
    """Its id: the ``--id-field`` value, else its line number (a string either way)."""
    line: int
    """Its line in the input (1-based; a CSV's header is line 1)."""
    fields: dict[str, object]
    """The object (JSONL) or the row by header (CSV)."""


@attrs.frozen(kw_only=True)
class Items:
    """What the input holds."""

    items: list[Item]
    """The well-formed ones, in input order."""
    malformed: list[tuple[int, str]]
    """``(line, why)`` of each line that is no item; none of them runs."""
    columns: list[str] | None = None
    """A CSV's header; ``None`` for JSONL."""


def _format(path: str, text: str, given: Format | None) -> Format:
    if given is not None:
        return given
    if path.endswith(".csv"):
        return "csv"
    if path.endswith((".jsonl", ".ndjson", ".json")):
        return "jsonl"
    # stdin or an unknown suffix: a JSONL line starts with '{'.
    first = next((line for line in text.split("\n") if line.strip()), "")
    return "jsonl" if first.lstrip().startswith("{") else "csv"


def _read_text(path: str) -> str:
    if path == "-":
        data = sys.stdin.buffer.read()
    else:
        with open(path, "rb") as f:
            data = f.read()
    # A byte that is not UTF-8 becomes a lone surrogate: its line is malformed, not all.
    return data.decode("utf-8-sig", "surrogateescape")


def _jsonl(text: str) -> Iterator[tuple[int, dict[str, object] | str]]:
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        if _NOT_UTF8.search(line):
            yield number, _WHY_NOT_UTF8
            continue
        try:
            value = loads_exact(line)
        except ValueError as exc:
            yield number, f"not JSON ({exc})"
            continue
        if not isinstance(value, dict):
            yield number, f"a JSON {type(value).__name__}, not an object"
            continue
        yield number, dict(value)


class _Lines:
    """The input's lines as the ``csv`` reader takes them (split at ``\r``, ``\n`` and
    ``\r\n``, as ``newline=""`` does), counting the line ends the reader has taken."""

    def __init__(self, text: str) -> None:
        self._lines = iter(io.StringIO(text, newline=""))
        self._ends = 0
        self._last = ""
        self.exhausted = False
        """The reader asked for a line past the last one."""

    def __iter__(self) -> _Lines:
        return self

    def __next__(self) -> str:
        try:
            line = next(self._lines)
        except StopIteration:
            self.exhausted = True
            raise
        self._ends += line.endswith("\n")
        self._last = line
        return line

    def record_ended(self) -> int:
        """The line the record just read ends on: every ``\n`` taken, and a bare ``\r``
        that ends the record (classic Mac endings); a ``\r`` inside a quoted cell is no
        line end, as in JSONL."""
        if self._last.endswith("\r"):
            self._ends += 1
            self._last = ""
        return self._ends


def _csv(text: str, columns: list[str]) -> Iterator[tuple[int, dict[str, object] | str]]:
    """The rows of a CSV; ``columns`` is filled with the header once it is read."""
    csv.field_size_limit(_CELL_LIMIT)
    lines = _Lines(text)
    reader = csv.reader(lines)
    header: list[str] | None = None
    ended = 0  # the line the previous record ended on
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:  # the reader goes on at the next line
            number, ended = ended + 1, lines.record_ended()
            yield number, f"not CSV ({exc})"
            continue
        number, ended = ended + 1, lines.record_ended()
        if not any(cell.strip() for cell in row):
            continue
        if header is None:
            header = row
            if len(set(header)) != len(header):
                raise InputError(f"the CSV header (line {number}) names a column twice")
            if _NOT_UTF8.search("".join(header)):
                raise InputError(f"the CSV header (line {number}) is not UTF-8")
            columns.extend(header)
            continue
        if lines.exhausted:
            # The lenient reader asks past the last line only from inside a quoted field,
            # which it then ends at the end of the input without a word.
            yield number, "a quoted field is never closed: it runs to the end of the input"
            continue
        if any(_NOT_UTF8.search(cell) for cell in row):
            yield number, _WHY_NOT_UTF8
            continue
        if len(row) != len(header):
            yield number, f"{len(row)} fields where the header has {len(header)}"
            continue
        yield number, dict(zip(header, row, strict=True))


def _id_of(fields: dict[str, object], id_field: str | None, line: int) -> str | None:
    if id_field is None:
        return str(line)
    value = fields.get(id_field)
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    text = str(value)
    return text if text.strip() else None


def read_items(
    path: str, *, id_field: str | None, fmt: Format | None, rename_duplicates: bool
) -> Items:
    """The items of ``path`` (``-``: stdin).

    Raises:
        InputError: duplicate ids (listed with their lines) unless ``rename_duplicates``
            (then the second is ``<id>-2``, the third ``<id>-3``), a CSV header naming a
            column twice or lacking ``id_field``.
        OSError: the file cannot be read.
    """
    text = _read_text(path)
    columns: list[str] = []
    is_csv = _format(path, text, fmt) == "csv"
    rows = _csv(text, columns) if is_csv else _jsonl(text)
    items: list[Item] = []
    malformed: list[tuple[int, str]] = []
    lines: dict[str, list[int]] = {}
    for line, parsed in rows:
        if is_csv and id_field is not None and not items and id_field not in columns:
            raise InputError(
                f"--id-field {id_field!r} is not a column of the CSV header "
                f"({', '.join(columns) or 'none'})"
            )
        if isinstance(parsed, str):
            malformed.append((line, parsed))
            continue
        item_id = _id_of(parsed, id_field, line)
        if item_id is None:
            malformed.append((line, f"no usable {id_field!r} (a non-empty string or integer)"))
            continue
        lines.setdefault(item_id, []).append(line)
        items.append(Item(id=item_id, line=line, fields=parsed))
    repeated = {k: v for k, v in lines.items() if len(v) > 1}
    if repeated and not rename_duplicates:
        shown = "; ".join(
            f"{k!r} on lines {', '.join(map(str, v))}" for k, v in list(repeated.items())[:_LISTED]
        )
        more = f" (and {len(repeated) - _LISTED} more)" if len(repeated) > _LISTED else ""
        raise InputError(
            f"duplicate ids: {shown}{more}; make them unique, or pass --rename-duplicates "
            "to number the repeats <id>-2, <id>-3"
        )
    if repeated:
        items = _renamed(items, set(lines))
    return Items(items=items, malformed=malformed, columns=columns if is_csv else None)


def _renamed(items: list[Item], taken: set[str]) -> list[Item]:
    """The second item of an id becomes ``<id>-2``, the third ``<id>-3`` (skipping a
    suffix another item already has as its own id)."""
    seen: dict[str, int] = {}
    out: list[Item] = []
    for item in items:
        n = seen.get(item.id, 0) + 1
        seen[item.id] = n
        if n == 1:
            out.append(item)
            continue
        candidate = f"{item.id}-{n}"
        while candidate in taken:
            n += 1
            candidate = f"{item.id}-{n}"
        seen[item.id] = n
        taken.add(candidate)
        out.append(attrs.evolve(item, id=candidate))
    return out
