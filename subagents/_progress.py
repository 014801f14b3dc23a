"""What a running child has reported so far: partial output and changed files.

A runner may report thousands of times (a streamed answer appended token by token, a file
per edit), so both are kept in time linear in what was reported and in memory bounded by
documented caps: the first :data:`MAX_OUTPUT_CHARS` characters of output and the first
:data:`MAX_FILES` distinct paths, with counts of what was dropped past them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import attrs

from ._envelope import Usage, clean_text
from ._validators import count, text, texts, usage

__all__ = [
    "MAX_FILES",
    "MAX_OUTPUT_CHARS",
    "Progress",
    "Report",
    "cap_files",
    "cap_output",
    "validated_report",
]

MAX_OUTPUT_CHARS: Final = 1_000_000
"""Characters of output an envelope keeps (the head); a marker says how many were dropped."""
MAX_FILES: Final = 1000
"""``files_changed`` entries an envelope keeps; the last says how many more there were."""
_MAX_DROPPED_SEEN: Final = 100_000  # hashes of dropped paths kept to skip their repeats


def cap_output(output: str, dropped: int = 0) -> str:
    """``output`` cut to :data:`MAX_OUTPUT_CHARS`, with a marker counting what is missing
    (``dropped`` characters already left out before it, plus any cut here)."""
    if len(output) > MAX_OUTPUT_CHARS:
        dropped += len(output) - MAX_OUTPUT_CHARS
        output = output[:MAX_OUTPUT_CHARS]
    if not dropped:
        return output
    return f"{output}\n[… {dropped} characters dropped …]"


def cap_files(files: Iterable[str], dropped: int = 0) -> tuple[str, ...]:
    """The distinct ``files`` in first-seen order, at most :data:`MAX_FILES` entries: past
    the cap the last entry counts the paths left out (plus ``dropped`` left out before)."""
    unique = tuple(dict.fromkeys(files))
    if len(unique) + (1 if dropped else 0) <= MAX_FILES:
        return (*unique, f"[… {dropped} more paths]") if dropped else unique
    kept = MAX_FILES - 1
    return (*unique[:kept], f"[… {len(unique) - kept + dropped} more paths]")


class Progress:
    """Partial output and changed files of one run, as reported through ``ctx.report``.

    Appending is amortised O(length appended): chunks are joined only when the output is
    read. Output past :data:`MAX_OUTPUT_CHARS` and distinct paths past :data:`MAX_FILES`
    are counted, not kept; repeats of a dropped path are recognised by hash for the first
    hundred thousand dropped (a rare hash collision undercounts by one).
    """

    __slots__ = ("_chars", "_chunks", "_dropped", "_dropped_seen", "_files", "_files_dropped")

    def __init__(self) -> None:
        self._chunks: list[str] = []
        self._chars = 0
        self._dropped = 0
        self._files: dict[str, None] = {}
        self._files_dropped = 0
        self._dropped_seen: set[int] = set()

    @property
    def output_chars(self) -> int:
        """Characters of output reported, those dropped past the cap included."""
        return self._chars + self._dropped

    @property
    def has_files(self) -> bool:
        return bool(self._files)

    def replace(self, text: str) -> None:
        """Make ``text`` the whole partial output."""
        self._chunks = []
        self._chars = 0
        self._dropped = 0
        self.append(text)

    def append(self, text: str) -> None:
        """Extend the partial output by ``text``."""
        room = MAX_OUTPUT_CHARS - self._chars
        if len(text) > room:
            self._dropped += len(text) - max(room, 0)
            text = text[: max(room, 0)]
        if text:
            self._chunks.append(text)
            self._chars += len(text)

    def output(self) -> str:
        """The partial output, with a marker if some was dropped past the cap."""
        if len(self._chunks) > 1:
            self._chunks = ["".join(self._chunks)]  # later reads and appends start from one
        text = self._chunks[0] if self._chunks else ""
        return cap_output(text, self._dropped)

    def add_files(self, paths: Iterable[str]) -> None:
        """Add ``paths`` not seen before, in order."""
        files = self._files
        for path in paths:
            if path in files:
                continue
            if len(files) < MAX_FILES:
                files[path] = None
                continue
            # A runner often reports its whole list again each turn: a dropped path is
            # remembered by its hash (up to a bound) so that repeats are not counted twice.
            seen = self._dropped_seen
            key = hash(path)
            if key in seen:
                continue
            if len(seen) < _MAX_DROPPED_SEEN:
                seen.add(key)
            self._files_dropped += 1

    def files(self, extra: Iterable[str] = ()) -> tuple[str, ...]:
        """The reported paths, then the ``extra`` ones not among them, capped."""
        return cap_files((*self._files, *extra), self._files_dropped)

    def followed_by(self, later: Progress, *, replaced: bool) -> Progress:
        """A new :class:`Progress`: this one, then what ``later`` (a retry's attempt kept
        apart, as on a remote worker) reported, as if one had served both: ``later``'s
        output replaces this one's if it ``replaced`` it, else extends it; its paths follow
        this one's. Neither is changed."""
        merged = Progress()
        if not replaced:
            merged._chunks = list(self._chunks)
            merged._chars = self._chars
            merged._dropped = self._dropped
        merged.append("".join(later._chunks))
        merged._dropped += later._dropped  # dropped past its cap: past the merged one's too
        merged._files = dict(self._files)
        merged._files_dropped = self._files_dropped
        merged._dropped_seen = set(self._dropped_seen)
        merged.add_files(later._files)
        fresh = later._dropped_seen - merged._dropped_seen
        merged._dropped_seen |= fresh
        merged._files_dropped += len(fresh) + later._files_dropped - len(later._dropped_seen)
        return merged


@attrs.frozen
class Report:
    """One ``ctx.report()`` call's values, validated and plain (picklable, so a remote
    context can send it as it is)."""

    output: str | None = None
    append: str | None = None
    usage: Usage | None = None
    iterations: int | None = None
    files: tuple[str, ...] | None = None

    def fold(self, progress: Progress) -> None:
        """Apply this report's output and files to ``progress``."""
        if self.output is not None:
            progress.replace(self.output)
        if self.append:
            progress.append(self.append)
        if self.files:
            progress.add_files(self.files)


def validated_report(
    output: str | None,
    append: str | None,
    usage_: Usage | None,
    iterations: int | None,
    files_changed: Iterable[str] | None,
) -> Report:
    """The arguments of ``ctx.report()`` as a :class:`Report`, all checked before any is
    used, and plain built-ins: a bad value, or a subclass's override, would otherwise fail
    only when the envelope is built, after the runner can no longer be blamed.

    Raises:
        ConfigError: a value of the wrong type or range, naming its argument.
    """
    return Report(
        output=None if output is None else clean_text(text("output", output)),
        append=None if append is None else clean_text(text("append", append)),
        usage=None if usage_ is None else usage("usage", usage_),
        iterations=None if iterations is None else count("iterations", iterations, minimum=0),
        files=None if files_changed is None else texts("files_changed", files_changed),
    )
