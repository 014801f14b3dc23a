"""Helpers for testing code that uses ``subagents``: a scripted model and a minimal
tool-calling loop that behaves like a host agent loop (per-tool timeouts, waking an idle
parent), a trivial agent type, and the conformance suites a mailbox or backend of your own
must pass (:func:`check_mailbox`, :func:`check_backend`).

Example::

    model = ScriptedModel([
        [ToolCall("spawn_agent", {"agent": "echo", "input": "a"})],
        "waiting for the result",               # ends the turn; the loop sleeps until woken
        ToolCall("wait_agent", lambda t: {"task_ids": t.task_ids()}),
        "done",
    ])
    transcript = await run_tool_loop(model, build_tools(manager, "root"))
    model.assert_done()
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Protocol, TypeAlias

import anyio
import attrs

from ._conformance import Check, ConformanceError
from ._conformance_backend import backend_checks, check_backend
from ._conformance_mailbox import MailboxFactory, check_mailbox, mailbox_checks
from ._envelope import bound_text
from ._errors import SpawnRejected
from ._json import JSONValue
from ._manager import SubagentManager, messenger_of
from ._messages import Message
from ._spec import AgentSpec, Request
from .tools import ToolResult, Toolset

__all__ = [
    "Check",
    "ConformanceError",
    "MailboxFactory",
    "ModelTurn",
    "ScriptError",
    "ScriptedModel",
    "ToolCall",
    "Transcript",
    "backend_checks",
    "call_with_host_timeout",
    "check_backend",
    "check_mailbox",
    "echo_agent",
    "mailbox_checks",
    "run_tool_loop",
]

# The conformance suites live in modules of their own; they are documented as this module's.
for _obj in (Check, ConformanceError, backend_checks, check_backend, check_mailbox, mailbox_checks):
    _obj.__module__ = __name__
del _obj

Arguments: TypeAlias = "JSONValue | Callable[[Transcript], object]"
_ids = itertools.count(1)


class ScriptError(AssertionError):
    """The loop asked the scripted model for something the script did not foresee, or
    left scripted turns unplayed."""


@attrs.frozen
class ToolCall:
    """One scripted tool call. ``arguments`` may be a function of the transcript so far
    (e.g. to pass the task ids returned by earlier spawns)."""

    name: str
    """The tool to call."""
    arguments: Arguments = attrs.field(factory=dict)
    """The arguments, or ``transcript -> arguments``."""
    id: str = attrs.field(factory=lambda: f"call_{next(_ids)}")
    """The call id (passed to the tool span)."""


@attrs.frozen(kw_only=True)
class ModelTurn:
    """One model reply: text, and tool calls (none ends the turn)."""

    text: str = ""
    """What the model said."""
    tool_calls: tuple[ToolCall, ...] = ()
    """The calls to execute before asking the model again."""


@attrs.frozen(kw_only=True)
class Step:
    """One executed tool call in a :class:`Transcript`."""

    name: str
    """The tool called."""
    call_id: str
    """The call id."""
    arguments: object
    """The resolved arguments."""
    result: ToolResult
    """What the tool returned (or the host's timeout error)."""


class Transcript:
    """What happened in a :func:`run_tool_loop` run."""

    def __init__(self) -> None:
        self.steps: list[Step] = []
        """Executed tool calls, in order."""
        self.texts: list[str] = []
        """The model's texts, in order."""
        self.events: list[str] = []
        """A flat log: ``model: ...``, ``call name``, ``message from <id>: ...``,
        ``woken: n``, ``idle``."""
        self.wakes = 0
        """How many times the idle loop was woken (by a finished child or a message)."""
        self.messages: list[Message] = []
        """Messages injected at step boundaries (before a model call), in order."""

    def results(self, name: str | None = None) -> list[ToolResult]:
        """Results of the calls to ``name`` (every call when ``None``)."""
        return [s.result for s in self.steps if name is None or s.name == name]

    def task_ids(self) -> list[str]:
        """The task ids returned by successful ``spawn_agent`` calls so far."""
        ids = []
        for result in self.results("spawn_agent"):
            task_id = result.details.get("task_id")
            if not result.is_error and isinstance(task_id, str):
                ids.append(task_id)
        return ids

    def collected(self) -> dict[str, JSONValue]:
        """Envelopes collected by ``wait_agent`` so far, by task id (first collection)."""
        out: dict[str, JSONValue] = {}
        for result in self.results("wait_agent"):
            entries = result.details.get("results")
            if not isinstance(entries, list):
                continue
            for entry in entries:
                if isinstance(entry, dict) and not entry.get("already_collected"):
                    out.setdefault(str(entry.get("task_id")), entry)
        return out


class Model(Protocol):
    """What :func:`run_tool_loop` drives: transcript and offered tool names in, a turn out."""

    def __call__(self, transcript: Transcript, tools: Sequence[str]) -> Awaitable[ModelTurn]:
        """Produce the next turn."""
        ...


ScriptItem: TypeAlias = "ModelTurn | ToolCall | Sequence[ToolCall] | str | object"


class ScriptedModel:
    """A model that plays canned turns in order.

    Each item is a :class:`ModelTurn`, a call (a turn with that one call), a list of calls
    (one turn calling them all) or a string (a text turn that ends the model's turn). A
    call is a :class:`ToolCall`, a ``(name, arguments)`` tuple or a ``{"name": ...,
    "arguments": ...}`` dict. Asking for a turn after the script ran out, or scripting a call to a
    tool the loop does not offer, raises :class:`ScriptError`; so does
    :meth:`assert_done` (and leaving ``with ScriptedModel(...)``) while turns are left.
    """

    def __init__(self, script: Iterable[ScriptItem]) -> None:
        self._turns = [_as_turn(item) for item in script]
        self._played = 0

    @property
    def remaining(self) -> int:
        """Turns not played yet."""
        return len(self._turns) - self._played

    async def __call__(self, transcript: Transcript, tools: Sequence[str] = ()) -> ModelTurn:
        if self._played >= len(self._turns):
            raise ScriptError(
                f"unexpected model call #{self._played + 1}: the script has only "
                f"{len(self._turns)} turns (last events: {transcript.events[-3:]})"
            )
        turn = self._turns[self._played]
        self._played += 1
        for call in turn.tool_calls:
            if tools and call.name not in tools:
                raise ScriptError(f"scripted call to {call.name!r}, which is not offered")
        await anyio.lowlevel.checkpoint()
        return turn

    def assert_done(self) -> None:
        """Raise :class:`ScriptError` if scripted turns were left unplayed."""
        if self.remaining:
            left = self._turns[self._played :]
            raise ScriptError(f"{self.remaining} scripted turn(s) left unplayed: {left!r}")

    def __enter__(self) -> ScriptedModel:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.assert_done()


def _as_call(item: object) -> ToolCall | None:
    if isinstance(item, ToolCall):
        return item
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
        return ToolCall(item[0], item[1])
    if isinstance(item, dict) and isinstance(item.get("name"), str):
        args = item.get("arguments", item.get("input", item.get("args", {})))
        return ToolCall(item["name"], args)
    return None


def _as_turn(item: object) -> ModelTurn:
    if isinstance(item, ModelTurn):
        return item
    if isinstance(item, str):
        return ModelTurn(text=item)
    single = _as_call(item)
    if single is not None:
        return ModelTurn(tool_calls=(single,))
    calls = tuple(_as_call(c) for c in item) if isinstance(item, (list, tuple)) else ()
    if not calls or any(c is None for c in calls):
        raise TypeError(f"a script item must be a turn, a call, calls or text, got {item!r}")
    return ModelTurn(tool_calls=tuple(c for c in calls if c is not None))


async def call_with_host_timeout(
    toolset: Toolset,
    name: str,
    args: object,
    *,
    call_id: str | None = None,
    timeout: float | None = None,
) -> ToolResult:
    """Run one call the way a host loop does: cancel it at its per-tool timeout.

    ``timeout`` defaults to :meth:`Toolset.timeout_for`. A killed call returns an error
    result with ``details["error"] == "host_timeout"``: the failure the layering rule
    exists to prevent for ``wait_agent``.
    """
    limit = toolset.timeout_for(name) if timeout is None else timeout
    with anyio.move_on_after(limit if limit is not None else float("inf")):
        return await toolset.call(name, args, call_id=call_id)
    return ToolResult(
        content=f"tool {name} was killed by the host after {limit} s",
        details={"error": "host_timeout", "timeout_s": limit},
        is_error=True,
    )


async def run_tool_loop(
    model: Model,
    toolset: Toolset,
    *,
    max_turns: int = 50,
    wake: bool = True,
) -> Transcript:
    """A minimal host loop: ask the model, run its tool calls (each under its host
    timeout), repeat; when the model ends its turn while children of the session still
    owe a result, sleep on :meth:`SubagentManager.activity` (a finished child or a
    message wakes it) and start a new turn.

    Every step boundary is a delivery point: before each model call the messages waiting
    for the session (``toolset.session_id``: a host session, or a child's task id) are
    appended to :attr:`Transcript.messages`, so the model's next call sees them, and taken
    (receipts ``read``) once that call returns: a call that raises leaves them unread. A
    loop of your own does the same with ``shown = ctx.inbox(peek=True)`` before the call
    and ``ctx.inbox(ids=[m.id for m in shown])`` after it (or ``manager.inbox(...)``), so a
    message that arrived during the call stays unread until a call shows it.

    Returns the transcript when the model ends its turn with nothing left to wait for
    (or ``wake`` is False). Raises :class:`ScriptError` after ``max_turns`` model turns.
    """
    transcript = Transcript()
    manager, session = toolset.manager, toolset.session_id
    for _ in range(max_turns):
        shown = _inject(manager, session, transcript)
        turn = await model(transcript, toolset.names)
        if shown:  # read only once the call that showed them returned
            messenger_of(manager).take_shown(session, shown)
        if turn.text:
            transcript.texts.append(turn.text)
            transcript.events.append(f"model: {turn.text}")
        if turn.tool_calls:
            for call in turn.tool_calls:
                args = call.arguments(transcript) if callable(call.arguments) else call.arguments
                transcript.events.append(f"call {call.name}")
                result = await call_with_host_timeout(toolset, call.name, args, call_id=call.id)
                transcript.steps.append(
                    Step(name=call.name, call_id=call.id, arguments=args, result=result)
                )
            continue
        owed = [h for h in manager.tasks(session) if not h.collected and not h.sync]
        if not wake or not owed:
            return transcript
        transcript.events.append("idle")
        woke = await manager.activity(session)
        if not woke:
            return transcript
        transcript.wakes += 1
        if woke.results:
            transcript.events.append(f"woken: {len(woke.results)}")
        else:
            transcript.events.append(f"woken by {len(woke.messages)} message(s)")
    raise ScriptError(f"the loop did not finish within {max_turns} model turns")


def _inject(manager: SubagentManager, session: str, transcript: Transcript) -> list[Message]:
    """The step boundary's delivery point: show what waits for ``session`` (peeked: a
    model call that fails saw nothing, so nothing is read)."""
    try:
        messages = manager.inbox(session_id=session, peek=True)
    except SpawnRejected:  # the session is closed (or its agent ended): nothing to take
        return []
    for message in messages:
        transcript.messages.append(message)
        transcript.events.append(f"message from {message.from_}: {bound_text(message.body, 200)}")
    return messages


def echo_agent(
    name: str = "echo", *, delay: float = 0.0, description: str = "Echoes its input."
) -> AgentSpec:
    """An agent type whose runner sleeps ``delay`` seconds and returns ``"<name>: <input>"``."""

    async def runner(request: Request, ctx: object) -> str:
        if delay:
            await anyio.sleep(delay)
        return f"{name}: {request.input}"

    return AgentSpec(name=name, description=description, runner=runner)
