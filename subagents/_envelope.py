"""The result envelope every spawn ends in, and its compact text view for models."""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable, Mapping
from typing import Final

import attrs

from ._json import JSONValue, dumps

__all__ = [
    "DEFAULT_TRUNCATE_CHARS",
    "DelegateResult",
    "Status",
    "Usage",
    "clean_text",
    "describe_exception",
    "now_ms",
    "plain_str",
]

DEFAULT_TRUNCATE_CHARS: Final = 2000
# An error message is a summary, not a traceback: the full text belongs to the event log.
_ERROR_MESSAGE_CHARS: Final = 500
# Below this many characters left for the output, truncated() drops the output for a marker.
_MIN_CUT_BODY: Final = 64
# The least header text worth keeping (the agent name and task id) before giving up the hint.
_MIN_HEADER_CHARS: Final = 24

_HINTS: Final = {
    "error": "hint: the subagent failed; fix the cause named above and spawn it again, "
    "or do the task yourself.",
    "timeout": "hint: the subagent ran out of time and the output above is partial; retry "
    "with a larger timeout_ms or a smaller task, or do it yourself.",
    "cancelled": "hint: the subagent was cancelled before it finished; spawn it again if "
    "the result is still needed.",
}


def clean_text(text: str) -> str:
    """``text`` with lone surrogates (undecodable bytes smuggled into ``str``, e.g. by
    ``surrogateescape``) replaced, so it always encodes to UTF-8 and JSON. A non-``str``
    passes through unchanged (a converter must not mask a type error checked elsewhere)."""
    if not isinstance(text, str) or encodes(text):
        return text
    return text.encode("utf-8", "replace").decode("utf-8")


def encodes(text: str) -> bool:
    """Whether ``text`` encodes to UTF-8 (it holds no lone surrogate), as the store, the
    events' JSON and the tracing exporters need of every text."""
    if text.isascii():  # O(1) in CPython (a flag): no surrogates, and no copy of a big text
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _str_tuple(value: Iterable[str]) -> tuple[str, ...]:
    items = (value,) if isinstance(value, str) else tuple(value)
    return tuple(clean_text(item) for item in items)


def _as_status(value: Status | str) -> Status:
    """``Status(value)``, skipping the enum lookup for a ``Status`` (every envelope's case)."""
    return value if type(value) is Status else Status(value)


def now_ms() -> int:
    """Current unix time in integer milliseconds."""
    return time.time_ns() // 1_000_000


class Status(enum.StrEnum):
    """How a subagent run ended."""

    COMPLETED = "completed"
    ERROR = "error"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"


@attrs.frozen(kw_only=True)
class Usage:
    """Token usage of one run (this agent only, never its children)."""

    input_tokens: int = 0
    """Tokens sent to the model."""
    output_tokens: int = 0
    """Tokens the model produced."""

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
        )

    def __bool__(self) -> bool:
        return bool(self.input_tokens or self.output_tokens)

    def to_dict(self) -> dict[str, int]:
        """``{"input_tokens": ..., "output_tokens": ...}``."""
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Usage:
        """Inverse of :meth:`to_dict`; missing keys count as zero."""
        return cls(
            input_tokens=_as_int(data.get("input_tokens", 0), "usage.input_tokens"),
            output_tokens=_as_int(data.get("output_tokens", 0), "usage.output_tokens"),
        )


_EMPTY_USAGE: Final = Usage()


@attrs.frozen(kw_only=True)
class DelegateResult:
    """The envelope a subagent run ends in: exactly one per spawn or delegation.

    Times are integer unix milliseconds. ``to_dict``/``to_json`` omit the optional fields
    (``output``, ``files_changed``, ``error``, ``error_type``, ``agent_path``,
    ``parent_path``, ``queue_ms`` when 0, ``attempts`` when 1) when they are empty, and
    ``tree_usage`` when it equals ``usage``.
    """

    agent: str
    """Name of the agent type that ran."""
    task_id: str
    """The task id given at spawn time; the mailbox key."""
    status: Status = attrs.field(converter=_as_status)
    """``completed``, ``error``, ``timeout`` or ``cancelled`` (a plain string is converted)."""
    output: str = attrs.field(default="", converter=clean_text)
    """Final output; on timeout or cancellation the partial output reported so far."""
    files_changed: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    """Paths the runner reported as changed."""
    error: str = attrs.field(default="", converter=clean_text)
    """A short, bounded summary of what went wrong (no traceback)."""
    error_type: str = ""
    """``timeout``, ``cancelled`` or the exception's qualified class name."""
    duration_ms: int = 0
    """Wall time from spawn (or the start of a delegation) to the end, queue included."""
    queue_ms: int = 0
    """Of ``duration_ms``, the time spent waiting for a concurrency slot."""
    iterations: int = 0
    """Iterations (model turns, steps) the runner reported."""
    attempts: int = 1
    """How many times the runner was started (more than 1 after transient retries)."""
    usage: Usage = _EMPTY_USAGE
    """Token usage of this run only."""
    timestamp_ms: int = attrs.field(factory=now_ms)
    """Unix time when the run ended."""
    agent_path: str = ""
    """Place in the delegation tree, e.g. ``/root/general``."""
    parent_path: str = ""
    """Path of the agent that delegated, e.g. ``/root``."""
    tree_usage: Usage = attrs.field(default=attrs.Factory(lambda self: self.usage, takes_self=True))
    """Token usage of this run and of every subagent below it, as their envelopes were
    made (default: ``usage``, a run that delegated nothing)."""

    @property
    def ok(self) -> bool:
        """True when ``status`` is ``completed``."""
        return self.status is Status.COMPLETED

    def to_dict(self) -> dict[str, JSONValue]:
        """A JSON-ready dict; empty optional fields are left out."""
        data: dict[str, JSONValue] = {
            "agent": self.agent,
            "task_id": self.task_id,
            "status": self.status.value,
        }
        if self.output:
            data["output"] = self.output
        if self.files_changed:
            data["files_changed"] = list(self.files_changed)
        if self.error:
            data["error"] = self.error
        if self.error_type:
            data["error_type"] = self.error_type
        data["duration_ms"] = self.duration_ms
        if self.queue_ms:
            data["queue_ms"] = self.queue_ms
        data["iterations"] = self.iterations
        if self.attempts != 1:
            data["attempts"] = self.attempts
        data["usage"] = dict(self.usage.to_dict())
        data["timestamp_ms"] = self.timestamp_ms
        if self.agent_path:
            data["agent_path"] = self.agent_path
        if self.parent_path:
            data["parent_path"] = self.parent_path
        if self.tree_usage != self.usage:
            data["tree_usage"] = dict(self.tree_usage.to_dict())
        return data

    def to_json(self) -> bytes:
        """Compact JSON bytes of :meth:`to_dict` (orjson)."""
        return dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> DelegateResult:
        """Rebuild an envelope from :meth:`to_dict` output.

        Raises:
            ValueError: a required field is missing or a field has the wrong type.
        """
        for key in ("agent", "task_id", "status"):
            if key not in data:
                raise ValueError(f"envelope field {key!r} is required")
        usage = data.get("usage") or {}
        if not isinstance(usage, Mapping):
            raise ValueError(f"envelope field 'usage' must be an object, got {usage!r}")
        tree = data.get("tree_usage", usage)
        if not isinstance(tree, Mapping):
            raise ValueError(f"envelope field 'tree_usage' must be an object, got {tree!r}")
        files = data.get("files_changed") or ()
        if not isinstance(files, (list, tuple)) or not all(isinstance(f, str) for f in files):
            raise ValueError("envelope field 'files_changed' must be a list of strings")
        try:
            status = Status(str(data["status"]))
        except ValueError:
            raise ValueError(
                f"envelope field 'status' must be one of {[s.value for s in Status]}, "
                f"got {data['status']!r}"
            ) from None
        return cls(
            agent=_as_str(data["agent"], "agent"),
            task_id=_as_str(data["task_id"], "task_id"),
            status=status,
            output=_as_str(data.get("output", ""), "output"),
            files_changed=tuple(files),
            error=_as_str(data.get("error", ""), "error"),
            error_type=_as_str(data.get("error_type", ""), "error_type"),
            duration_ms=_as_int(data.get("duration_ms", 0), "duration_ms"),
            queue_ms=_as_int(data.get("queue_ms", 0), "queue_ms"),
            iterations=_as_int(data.get("iterations", 0), "iterations"),
            attempts=_as_int(data.get("attempts", 1), "attempts"),
            usage=Usage.from_dict(usage),
            timestamp_ms=_as_int(data.get("timestamp_ms", 0), "timestamp_ms"),
            agent_path=_as_str(data.get("agent_path", ""), "agent_path"),
            parent_path=_as_str(data.get("parent_path", ""), "parent_path"),
            tree_usage=Usage.from_dict(tree),
        )

    def truncated(self, max_chars: int = DEFAULT_TRUNCATE_CHARS) -> str:
        """The compact text view a model reads, never longer than ``max_chars``.

        A few header lines (agent, task id, path, status, duration, usage, error), then the
        output. When it does not fit, the middle of the output is cut by code points and
        replaced by a marker saying how many characters were left out. Error, timeout and
        cancelled views end with a one-line hint of what to do next. When ``max_chars`` is
        too small for all of that, the output is replaced by the marker alone and the header
        is shortened, so the marker and the hint stay visible down to about 200 characters.
        """
        if max_chars < 1:
            raise ValueError(f"max_chars must be an integer >= 1, got {max_chars!r}")
        hint = _HINTS.get(self.status.value, "")
        head = "\n".join(self._header_lines()) + "\n"
        tail = ("\n" + hint) if hint else ""
        body = self.output if self.output else "(no output)"
        if len(head) + len(body) + len(tail) <= max_chars:
            return head + body + tail
        budget = max_chars - len(head) - len(tail)
        if budget >= _MIN_CUT_BODY:
            return head + cut_middle(body, budget) + tail
        # Too tight for the header, some output and the hint: the output gives way to a
        # marker, then the header is shortened, so the hint and the marker stay visible.
        marker = f"[… {len(self.output)} characters truncated …]" if self.output else body
        room = max_chars - len(marker) - len(tail)
        if room >= _MIN_HEADER_CHARS:
            return bound_text(head.rstrip("\n"), room - 1) + "\n" + marker + tail
        return bound_text(head + marker + tail, max_chars)  # only for absurdly small bounds

    def _header_lines(self) -> list[str]:
        where = f" · {self.agent_path}" if self.agent_path else ""
        lines = [f"[subagent {self.agent} · task {self.task_id}{where}]"]
        facts = [f"status: {self.status.value}", f"{self.duration_ms} ms"]
        if self.iterations:
            facts.append(f"{self.iterations} iterations")
        if self.attempts > 1:
            facts.append(f"{self.attempts} attempts")
        if self.usage:
            facts.append(f"tokens in {self.usage.input_tokens} / out {self.usage.output_tokens}")
        if self.tree_usage != self.usage:
            tree = self.tree_usage
            facts.append(f"with its subagents in {tree.input_tokens} / out {tree.output_tokens}")
        lines.append(" · ".join(facts))
        if self.files_changed:
            shown = ", ".join(self.files_changed[:10])
            more = len(self.files_changed) - 10
            lines.append(f"files changed: {shown}" + (f" (+{more} more)" if more > 0 else ""))
        if self.error:
            lines.append(f"error: {bound_text(self.error, _ERROR_MESSAGE_CHARS)}")
        lines.append("output:")
        return lines


def cut_middle(text: str, budget: int) -> str:
    """Keep the start and the end of ``text`` within ``budget`` code points."""
    marker_room = len(f"\n[… {len(text)} characters truncated …]\n")
    keep = budget - marker_room
    if keep <= 0:
        return text[: max(budget, 0)]
    head_len = (keep * 2) // 3
    tail_len = keep - head_len
    omitted = len(text) - keep
    marker = f"\n[… {omitted} characters truncated …]\n"
    return text[:head_len] + marker + (text[len(text) - tail_len :] if tail_len else "")


def bound_text(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` code points, with an ellipsis when cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def plain_str(value: object) -> str | None:
    """``value`` as a plain ``str``, or ``None`` if it is not a string: a subclass is
    copied, so none of its overrides runs later. ``type(value)`` rather than
    ``isinstance``: an object can claim a ``__class__``."""
    kind = type(value)
    if kind is str:
        return value  # type: ignore[return-value]
    if issubclass(kind, str):
        return str.__str__(value)
    return None


def describe_exception(exc: BaseException) -> tuple[str, str]:
    """``(error_type, message)`` for an envelope: qualified class name and bounded text.

    An exception group around a single exception (a task group in the runner) is described
    by that exception; a larger group names its first few members.
    """
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    cls = type(exc)
    # A runner's exception class may carry anything in these: keep plain strings only.
    qualname = plain_str(getattr(cls, "__qualname__", None)) or "<exception>"
    module = plain_str(getattr(cls, "__module__", None)) or ""
    plain_module = module in ("builtins", "__main__", "")
    error_type = qualname if plain_module else f"{module}.{qualname}"
    try:
        text = plain_str(str(exc))
    except Exception:  # a __str__ that raises must not lose the envelope
        text = None
    if text is None:
        text = "<unprintable exception>"
    message = f"{qualname}: {text}" if text else qualname
    if isinstance(exc, BaseExceptionGroup):
        members = "; ".join(describe_exception(e)[1] for e in exc.exceptions[:3])
        message = f"{message}: {members}"
    return error_type, clean_text(bound_text(message, _ERROR_MESSAGE_CHARS))


def _as_int(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"envelope field {field!r} must be an integer, got {value!r}")
    return value


def _as_str(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"envelope field {field!r} must be a string, got {value!r}")
    return value


# The runtime's own envelopes skip the attrs __init__ (its converters re-check what the
# runtime already guarantees: a Status, a tuple of str) and set the slots directly, in
# field order, which costs a tenth of a no-op child less (design/performance.md). Text is
# still cleaned here.
_TRUSTED_FIELDS: Final = (
    "agent",
    "task_id",
    "status",
    "output",
    "files_changed",
    "error",
    "error_type",
    "duration_ms",
    "queue_ms",
    "iterations",
    "attempts",
    "usage",
    "timestamp_ms",
    "agent_path",
    "parent_path",
    "tree_usage",
)
if tuple(f.name for f in attrs.fields(DelegateResult)) != _TRUSTED_FIELDS:  # pragma: no cover
    raise RuntimeError("trusted_envelope() is out of date with DelegateResult's fields")
(
    _set_agent,
    _set_task_id,
    _set_status,
    _set_output,
    _set_files_changed,
    _set_error,
    _set_error_type,
    _set_duration_ms,
    _set_queue_ms,
    _set_iterations,
    _set_attempts,
    _set_usage,
    _set_timestamp_ms,
    _set_agent_path,
    _set_parent_path,
    _set_tree_usage,
) = (vars(DelegateResult)[name].__set__ for name in _TRUSTED_FIELDS)
_new = object.__new__


def trusted_envelope(
    agent: str,
    task_id: str,
    status: Status,
    output: str,
    files_changed: tuple[str, ...],
    error: str,
    error_type: str,
    duration_ms: int,
    queue_ms: int,
    iterations: int,
    attempts: int,
    usage: Usage,
    timestamp_ms: int,
    agent_path: str,
    parent_path: str,
    tree_usage: Usage,
    /,
) -> DelegateResult:
    """``DelegateResult(...)`` for values of the right types (``status`` a :class:`Status`,
    ``files_changed`` a tuple of ``str``); output, error and paths are cleaned
    (:func:`clean_text`) as the converters would. Equal to the attrs-built envelope."""
    envelope: DelegateResult = _new(DelegateResult)
    _set_agent(envelope, agent)
    _set_task_id(envelope, task_id)
    _set_status(envelope, status)
    _set_output(envelope, clean_text(output))
    _set_files_changed(
        envelope, tuple(clean_text(f) for f in files_changed) if files_changed else ()
    )
    _set_error(envelope, clean_text(error) if error else "")
    _set_error_type(envelope, error_type)
    _set_duration_ms(envelope, duration_ms)
    _set_queue_ms(envelope, queue_ms)
    _set_iterations(envelope, iterations)
    _set_attempts(envelope, attempts)
    _set_usage(envelope, usage)
    _set_timestamp_ms(envelope, timestamp_ms)
    _set_agent_path(envelope, agent_path)
    _set_parent_path(envelope, parent_path)
    _set_tree_usage(envelope, tree_usage)
    return envelope
