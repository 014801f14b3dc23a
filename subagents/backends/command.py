"""A runner that runs one subprocess per request: an argv template filled from the item.

``CommandRunner("wc -c {path}")`` is an ``async def runner(request, ctx)`` for an
:class:`~subagents.AgentSpec` (``command_agent`` builds the spec). Per run:

- the request's ``input`` is the item: a JSON object (anything else is the object
  ``{"input": <the text>}``); each ``{field}`` of the template is replaced by the item's
  field, after the template is split into words (``shlex``), so a value is always one
  argument and nothing goes through a shell (for one, ``sh -c '... "$1"' sh {field}``:
  the value is the script's argument, never its source); a ``{{`` and the ``}}`` that
  closes it, in one word, are a literal ``{`` and ``}`` (``{{name}}`` is the text
  ``{name}``), and any other brace stays as written;
- the input is written to the process's stdin, its stdout becomes the result's ``output``;
- a non-zero exit raises :class:`CommandFailed` (exit code, the tail of stderr): an
  ``error`` envelope, retried under the agent's :class:`~subagents.RetryPolicy` if it lists
  the class; a zero exit whose stdout is still open 5 s later (a descendant that left the
  group holds it) is an ``error`` envelope too, with the output read so far, since it may
  be cut short;
- the process leads a process group of its own (``start_new_session``). Cut short (the
  watchdog, cancellation) the group gets ``SIGTERM``, then ``SIGKILL`` after ``grace``
  seconds; after a normal exit it gets ``SIGKILL`` at once (what is left of it is
  background processes the command left behind, which would otherwise hold its stdout
  open). So no descendant that stays in the group outlives the run.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
from collections.abc import Mapping, Sequence
from typing import Final

import anyio
import anyio.abc

from .._context import RunContext
from .._errors import ConfigError
from .._json import dumps_str, loads
from .._retry import RetryPolicy
from .._spec import AgentSpec, Request, Result
from .._validators import count, seconds
from . import _spawn, _warden

__all__ = ["CommandFailed", "CommandRunner", "MissingField", "command_agent", "fill_template"]

_FIELD: Final = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_.-]*)\}")
"""A ``{field}`` of a template (a name only, so ``awk '{print $1}'`` keeps its braces), or
``{{`` / ``}}``: a pair of them is a literal ``{`` ... ``}`` (``awk '/x/{{next}} 1'``), one
that pairs with none stays as written (``jq '{a: {b: .x}}'``)."""
_EXACT_INT: Final = 2**53
"""An integral float below this is filled as the integer it is exactly (``3.0``: ``3``)."""


class MissingField(KeyError):
    """A ``{field}`` of a template that the item does not have; ``field`` names it."""

    def __init__(self, field: str) -> None:
        self.field = field
        super().__init__(field)

    def __str__(self) -> str:  # KeyError's own quotes the message as a repr
        return f"the item has no field {self.field!r} for {{{self.field}}}"


class CommandFailed(Exception):
    """The command exited non-zero (or was killed by a signal: ``exit_code`` < 0).

    A run failure, like :class:`~subagents.TransientError`, not one of the library's
    refusals, so it is no :class:`~subagents.SubagentsError`.
    """

    def __init__(self, argv: Sequence[str], exit_code: int, stderr: str) -> None:
        self.argv = tuple(argv)
        self.exit_code = exit_code
        self.stderr = stderr
        how = f"signal {-exit_code}" if exit_code < 0 else f"exit code {exit_code}"
        tail = f"; stderr: {stderr.strip()}" if stderr.strip() else ""
        super().__init__(f"{shlex.join(self.argv)} failed with {how}{tail}")


class CommandRunner:
    """``async def runner(request, ctx) -> Result``: one subprocess per run (module doc).

    Args:
        command: the argv template, a string (split with ``shlex``) or a sequence of words;
            ``{field}`` in a word is the item's field (a string as is, another value as
            JSON, ``null`` as the empty string).
        grace: seconds between ``SIGTERM`` and ``SIGKILL`` when the run is cut short.
        stderr_tail: how many characters of stderr end up in :class:`CommandFailed`.
        cwd: the working directory (default: the current one).
        env: the environment (default: this process's).

    Raises:
        ConfigError: an empty template, a negative grace.
    """

    def __init__(
        self,
        command: str | Sequence[str],
        *,
        grace: float = 5.0,
        stderr_tail: int = 2000,
        cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        try:
            words = shlex.split(command) if isinstance(command, str) else [str(w) for w in command]
        except ValueError as exc:  # shlex: an unbalanced quote, a trailing escape
            raise ConfigError("command", f"a shell-quoted argv template ({exc})", command) from None
        if not words:
            raise ConfigError("command", "a non-empty argv template", command)
        self.argv_template: tuple[str, ...] = tuple(words)
        self.fields: frozenset[str] = frozenset().union(*map(_template_fields, words))
        self.grace: float = seconds("grace", grace, none_ok=False, zero_ok=True)
        self.stderr_tail: int = count("stderr_tail", stderr_tail, minimum=0)
        self.cwd = cwd
        self.env = env

    def argv(self, item: Mapping[str, object]) -> list[str]:
        """The template filled from ``item``.

        Raises:
            MissingField: a ``{field}`` the item does not have (a ``KeyError`` naming it).
        """

        return [fill_template(word, item) for word in self.argv_template]

    async def __call__(self, request: Request, ctx: RunContext) -> Result:
        argv = self.argv(_item_of(request.input))
        stdout, code, stderr, cut = await self._run(argv, request.input.encode("utf-8", "replace"))
        if code != 0:
            raise CommandFailed(argv, code, stderr)
        if cut:
            # An error, not a success: what was read may be only part of the output.
            return Result(output=stdout, error=_cut_message())
        return Result(output=stdout)

    async def run(self, argv: Sequence[str], stdin: bytes) -> tuple[str, int, str]:
        """Run ``argv`` with ``stdin``: ``(stdout, exit code, stderr tail)``. Blocks until
        the process has exited and its pipes are closed (at most ``REAP_TIMEOUT`` (5) seconds
        past its exit: a descendant that left its group may hold them; stdout is then what
        was read by that bound, and the runner's result says so as an error).

        Cancellation (the watchdog's included) ends the process group, ``SIGTERM`` then
        ``SIGKILL`` after ``grace`` seconds, shielded, then propagates.
        """
        stdout, code, stderr, _ = await self._run(argv, stdin)
        return stdout, code, stderr

    async def _run(self, argv: Sequence[str], stdin: bytes) -> tuple[str, int, str, bool]:
        """:meth:`run`, and whether stdout was cut by the bound (still open at it)."""
        keep = self.stderr_tail * 4  # bytes: a character is at most four in UTF-8
        if _spawn.AVAILABLE:
            outcome = await _spawn.run_command(
                argv, stdin, cwd=self.cwd, env=self.env, stderr_keep=keep, grace=self.grace
            )
        else:
            outcome = await _run_open_process(argv, stdin, self.cwd, self.env, keep, self.grace)
        out, code, err, cut = outcome
        text = err.decode("utf-8", "replace")
        tail = text[len(text) - self.stderr_tail :] if self.stderr_tail else ""
        return out.decode("utf-8", "replace"), code, tail, cut


def command_agent(
    command: str | Sequence[str],
    *,
    name: str = "command",
    description: str = "",
    timeout: float | None = None,
    retries: int = 0,
    grace: float = 5.0,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> AgentSpec:
    """An :class:`~subagents.AgentSpec` whose runner is ``CommandRunner(command, ...)``;
    ``retries`` further tries follow a :class:`CommandFailed` (backoff 0.1 s doubling)."""
    count("retries", retries, minimum=0)
    runner = CommandRunner(command, grace=grace, cwd=cwd, env=env)
    retry = None if retries == 0 else RetryPolicy(attempts=retries + 1, retry_on=CommandFailed)
    return AgentSpec(
        name=name,
        runner=runner,
        description=description or f"runs {shlex.join(runner.argv_template)}",
        timeout=timeout,
        retry=retry,
    )


def fill_template(template: str, item: Mapping[str, object]) -> str:
    """``template`` with each ``{field}`` replaced by the item's field (a string as is,
    ``null`` as the empty string, anything else as JSON, an integral float below 2**53 as
    its integer). A ``{{`` and the ``}}`` that closes it (innermost first) are a literal
    ``{`` and ``}``; every other brace stays as written, so ``{print $1}``, a lone ``}}``
    and ``jq '{a: {b: .x}}'`` are left alone.

    Raises:
        MissingField: a ``{field}`` the item does not have (a ``KeyError`` naming it).
    """
    matches = list(_FIELD.finditer(template))
    paired = _paired(matches)
    pieces: list[str] = []
    at = 0
    for index, match in enumerate(matches):
        pieces.append(template[at : match.start()])
        at = match.end()
        name = match.group(1)
        if not name:
            pieces.append(match.group(0)[0] if index in paired else match.group(0))
        elif name in item:
            pieces.append(_as_word(item[name]))
        else:
            raise MissingField(name)
    pieces.append(template[at:])
    return "".join(pieces)


def _paired(matches: list[re.Match[str]]) -> set[int]:
    """The indexes of the ``{{`` and ``}}`` matches that pair up (as brackets do)."""
    opened: list[int] = []
    paired: set[int] = set()
    for index, match in enumerate(matches):
        if match.group(0) == "{{":
            opened.append(index)
        elif match.group(0) == "}}" and opened:
            paired.update((opened.pop(), index))
    return paired


def _template_fields(template: str) -> frozenset[str]:
    """The names of the ``{field}`` placeholders of ``template``."""
    return frozenset(m.group(1) for m in _FIELD.finditer(template) if m.group(1))


def _item_of(text: str) -> Mapping[str, object]:
    try:
        value = loads(text)
    except ValueError:
        return {"input": text}
    return value if isinstance(value, dict) else {"input": text}


def _as_word(value: object) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer() and abs(value) < _EXACT_INT:
        return str(int(value))
    return dumps_str(value)


async def _run_open_process(
    argv: Sequence[str],
    stdin: bytes,
    cwd: str | os.PathLike[str] | None,
    env: Mapping[str, str] | None,
    stderr_keep: int,
    grace: float,
) -> _spawn.Outcome:
    """:meth:`CommandRunner.run` through ``anyio.open_process``, where pidfds are missing:
    a task for each pipe, the exit awaited beside them."""
    # Shielded: a cancellation while the process is being started would leave it
    # running (or killed alone, its children not), with no handle here to end it by.
    with anyio.CancelScope(shield=True):
        process = await anyio.open_process(list(argv), cwd=cwd, env=env, start_new_session=True)
    _warden.started(process.pid)
    out = bytearray()
    err = bytearray()
    out_closed = anyio.Event()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_feed, process, stdin)
            tg.start_soon(_drain, process.stdout, out, None, out_closed)
            tg.start_soon(_drain, process.stderr, err, stderr_keep, anyio.Event())
            code = await process.wait()
            # What is left of the group is what the command left in the background:
            # it ends now, or a child holding stdout would keep the run from ending.
            _spawn.signal_group(process.pid, signal.SIGKILL)
            # A descendant that left the group may still hold a pipe: bounded.
            tg.cancel_scope.deadline = anyio.current_time() + _spawn.REAP_TIMEOUT
    finally:
        with anyio.CancelScope(shield=True):
            await _end_group(process, grace)
        _warden.ended(process.pid)
    return bytes(out), code, bytes(err), not out_closed.is_set()


async def _feed(process: anyio.abc.Process, data: bytes) -> None:
    stream = process.stdin
    if stream is None:
        return
    try:
        if data:
            await stream.send(data)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        pass  # the command exited, or closed stdin, without reading all of it: its choice
    finally:
        await stream.aclose()


async def _drain(
    stream: anyio.abc.ByteReceiveStream | None,
    into: bytearray,
    keep: int | None,
    closed: anyio.Event,
) -> None:
    if stream is not None:
        async for chunk in stream:
            into += chunk
            _spawn.keep_tail(into, keep)  # only the tail is reported: stderr stays bounded
    closed.set()


def _cut_message() -> str:
    return (
        f"the command exited 0 but its stdout was still open {_spawn.REAP_TIMEOUT:g} s later (held "
        "by a process that left its process group): the output may be cut short"
    )


async def _end_group(process: anyio.abc.Process, grace: float) -> None:
    """End the process and its group: SIGTERM, ``grace`` seconds, SIGKILL; then reap
    (bounded: ``REAP_TIMEOUT``).

    After a normal exit this still signals the group, which ends the background
    processes the command left (the kernel hands out no pid still in use as a group's
    id, so while any of them lives the id names their group alone)."""
    pgid = process.pid
    if process.returncode is None and _spawn.signal_group(pgid, signal.SIGTERM):
        with anyio.move_on_after(grace):
            await process.wait()
    _spawn.signal_group(pgid, signal.SIGKILL)
    with anyio.move_on_after(_spawn.REAP_TIMEOUT):
        await process.wait()
    if process.returncode is not None:
        await process.aclose()
        return
    # Not reaped in time (uninterruptible sleep): close the pipes and leave it, since
    # anyio's own aclose would wait for it without a bound.
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            await stream.aclose()
