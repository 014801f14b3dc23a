"""``subagents batch run``: the items through a manager, their envelopes into the store,
then into the results file, with progress, ``--halt`` and Ctrl-C.

Admission is this module's, in input order: at most ``--jobs`` items run at once, and at
most ``_BACKLOG`` more wait for their commit and line, so stopping admission (``--halt``,
Ctrl-C) leaves every other item without an envelope, for ``--resume`` to run. The manager
is in memory and forgets each child once its envelope is taken (``retain_collected=0``):
the store, not the manager, is the batch's memory, so a batch of any length runs in
bounded memory.

``--jobs`` runner tasks take the items in input order; each spawns its item, waits for the
envelope, puts it in the store and goes on to the next (no task and no worker started per
item). One task writes the results lines: it takes the envelopes put so far, waits once
for their commit (group-committed), then writes their lines. A kill at any point leaves
the item either without an envelope (run again by ``--resume``) or with one in the store,
and its line written or not: :func:`reconcile` settles that on resume.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import suppress
from typing import Final, Literal, TextIO

import anyio
import attrs

from ._cli_batch_inputs import Item, Items
from ._cli_batch_journal import BatchJournal, batch_name
from ._cli_batch_progress import Counters, Mode, Progress, choose_mode
from ._cli_batch_results import ResultsFile, line_of, reconcile
from ._cli_batch_summary import EXIT_USAGE, Halt, Tally, exit_status, print_summary
from ._envelope import DelegateResult, describe_exception
from ._json import dumps_str
from ._jsonl import JsonlSink
from ._manager import SubagentManager
from ._spec import UNSET, AgentSpec, SubagentConfig
from .backends.command import fill_template
from .store import SqliteStore, StoreError

__all__ = ["DEFAULT_TIMEOUT", "Resume", "Settings", "run_batch"]

Resume = Literal["fresh", "resume", "retry-failed"]
_BACKLOG: Final = 4096
"""Items whose envelope awaits its commit (and its line) at most, and lines held back by
``--keep-order`` at most: a bound on memory while the store (or a slow item) is slower
than the runners."""
DEFAULT_TIMEOUT: Final = 1800.0
"""An item's watchdog in seconds when neither ``--timeout`` nor its agent sets one."""
_COMMIT_DELAY: Final = 0.02
"""Seconds the store's writer gathers envelopes after a commit: a batch's envelopes
trickle in one by one, and each would otherwise get a transaction (and an fsync) of its
own; a results line waits for its commit, so it is written at most this much later."""
_MANIFEST_EVERY: Final = 1.0
"""Seconds between two rewrites of the manifest ``batch status`` reads."""


@attrs.frozen(kw_only=True)
class Settings:
    """A ``batch run`` command line, checked."""

    out: str
    store: str
    specs: list[AgentSpec]
    template: str | None
    """``--template``: an agent's input text; ``None``: the item as JSON."""
    jobs: int
    timeout: float | None
    """``--timeout``: every item's watchdog; ``None``: the agent's own, else
    :data:`DEFAULT_TIMEOUT`."""
    resume: Resume
    halt: Halt | None
    keep_order: bool
    progress: Mode
    events: str | None
    grace: float
    """Seconds from Ctrl-C to the cancellation of what still runs."""


@attrs.define
class _Run:
    """The state one run's tasks share."""

    settings: Settings
    manager: SubagentManager
    journal: BatchJournal
    results: ResultsFile
    tally: Tally
    counters: Counters
    total: int
    """Items this run admits at most."""
    stop: anyio.Event = attrs.Factory(anyio.Event)
    running: dict[str, str] = attrs.Factory(dict)
    """Item id -> task id of what runs."""
    failures: list[Exception] = attrs.Factory(list)
    """What stopped the run from recording: the results file's OSError (the sink reports
    it), the store's StoreError."""
    stopped: str | None = None
    interrupted: int | None = None
    """The signal (SIGINT, SIGTERM) that interrupted the run, if one did."""
    failed_seen: int = 0
    """Envelopes of this run that did not complete, counted as they come (``--halt``
    judges these; the tally counts them once their lines are written)."""

    def halt(self, why: str) -> None:
        if self.stopped is None:
            self.stopped = why
        self.stop.set()

    def cancel_running(self) -> None:
        for task_id in list(self.running.values()):
            self.manager.cancel(task_id)


def _agent_for(item: Item, specs: list[AgentSpec]) -> str:
    if len(specs) == 1:
        return specs[0].name
    name = item.fields.get("agent")
    if not isinstance(name, str):
        names = ", ".join(s.name for s in specs)
        raise LookupError(f"the item has no 'agent' field naming one of the specs ({names})")
    return name


def _input_of(item: Item, template: str | None) -> str:
    if template is None:
        return dumps_str(item.fields)
    return fill_template(template, item.fields)


def _refused(agent: str, exc: Exception) -> DelegateResult:
    """The envelope of an item that could not even be spawned."""
    error_type, message = describe_exception(exc)
    return DelegateResult(
        agent=agent or "batch", task_id="", status="error", error=message, error_type=error_type
    )


async def _runner(run: _Run, feed: Iterator[Item], lines: _Lines) -> None:
    """Run items one after another, in input order with the other runners, until the
    input ends or the run stops; each envelope is recorded, and handed to ``lines``."""
    while await lines.room():
        item = next(feed, None)
        if item is None:
            return
        envelope = await _envelope_of(run, item)
        # Judged (--halt) as it comes; counted (the tally, the progress) once its line is
        # written, so a failed store leaves no count of a line the file lacks.
        run.failed_seen += not envelope.ok
        halt = run.settings.halt
        if halt is not None and not envelope.ok and _halt_reached(run, halt):
            run.halt(f"halted: {_failed(run)} failed (--halt); the rest not started")
        try:
            run.journal.record(item.id, envelope)
        except StoreError as exc:  # the batch cannot record anything more: it stops
            run.failures.append(exc)
            run.halt("stopped: the store failed")
            return
        lines.add(item.id, envelope)


class _Lines:
    """The envelopes recorded and not yet written: :meth:`run` writes them, a batch at a
    time, once the store has committed them (one wait for the lot, group-committed)."""

    def __init__(self, run: _Run) -> None:
        self._run = run
        self._pending: list[tuple[str, DelegateResult]] = []
        self._unwritten = 0
        self._closed = False
        self._added = anyio.Event()
        self._written = anyio.Event()

    def add(self, item_id: str, envelope: DelegateResult) -> None:
        self._pending.append((item_id, envelope))
        self._unwritten += 1
        self._added.set()

    def close(self) -> None:
        """Nothing more comes: :meth:`run` ends once it has written what it has."""
        self._closed = True
        self._added.set()

    def wake(self) -> None:
        """The run stopped: whoever waits in :meth:`room` looks again."""
        self._written.set()

    async def room(self) -> bool:
        """Wait while :data:`_BACKLOG` lines are unwritten or held back (``--keep-order``,
        behind a slow item, which runs: admission is in input order); False once the run
        has stopped (admit nothing more)."""
        run = self._run
        while not run.stop.is_set():
            if self._unwritten < _BACKLOG and run.results.held < _BACKLOG:
                return True
            if self._written.is_set():
                self._written = anyio.Event()
            await self._written.wait()
        return False

    async def run(self) -> None:
        run = self._run
        while self._pending or not self._closed:
            if not self._pending:
                self._added = anyio.Event()
                await self._added.wait()
                continue
            batch, self._pending = self._pending, []
            try:
                await run.journal.wait_committed()
            except StoreError as exc:  # their lines are never written: the store lacks them
                run.failures.append(exc)
                run.halt("stopped: the store failed")
                return
            for item_id, envelope in batch:
                run.tally.add(item_id, envelope, here=True)
                run.counters.done += 1
                run.counters.failed += not envelope.ok
                run.results.write(item_id, envelope)
            self._unwritten -= len(batch)
            self._written.set()
            if run.failures:
                run.halt("stopped: the results file could not be written")


def _failed(run: _Run) -> int:
    """This run's failures as ``--halt`` counts them: as the exit status does, malformed
    input lines included."""
    return run.failed_seen + run.tally.malformed


def _halt_reached(run: _Run, halt: Halt) -> bool:
    # A percentage is of what this run admits at most, the malformed lines included.
    return halt.reached(_failed(run), run.total + run.tally.malformed)


async def _envelope_of(run: _Run, item: Item) -> DelegateResult:
    agent = ""
    try:
        agent = _agent_for(item, run.settings.specs)
        text = _input_of(item, run.settings.template)
        timeout = UNSET if run.settings.timeout is None else run.settings.timeout
        handle = run.manager.spawn(agent, text, timeout=timeout)
    except Exception as exc:  # a bad item is its own error envelope, never the batch's
        return _refused(agent, exc)
    run.running[item.id] = handle.task_id
    run.counters.running += 1
    try:
        envelope = await handle.wait()
    finally:
        run.counters.running -= 1
        del run.running[item.id]
    run.manager.collect(handle)  # retain_collected=0: the record goes with it
    return envelope


async def _admit(run: _Run, items: list[Item]) -> None:
    """Run the items, ``--jobs`` at a time, until they end or the run stops; returns once
    every envelope recorded is written (or the store failed)."""
    halt = run.settings.halt
    if halt is not None and run.tally.malformed and _halt_reached(run, halt):
        run.halt(f"halted: {_failed(run)} malformed input lines (--halt); nothing started")
        return
    feed = iter(items)
    lines = _Lines(run)
    async with anyio.create_task_group() as tg:
        tg.start_soon(lines.run)
        watch = anyio.CancelScope()
        tg.start_soon(_wake_on_stop, run, lines, watch)
        try:
            async with anyio.create_task_group() as runners:
                for _ in range(min(run.settings.jobs, len(items))):
                    runners.start_soon(_runner, run, feed, lines)
        finally:
            watch.cancel()
            lines.close()


async def _wake_on_stop(run: _Run, lines: _Lines, watch: anyio.CancelScope) -> None:
    with watch:
        await run.stop.wait()
        lines.wake()


async def _signals(run: _Run) -> None:
    """Ctrl-C or SIGTERM: stop admitting; cancel what runs after the grace (at once on a
    second signal)."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as received:
        async with anyio.create_task_group() as tg:
            async for signum in received:
                if run.interrupted is not None:
                    run.cancel_running()
                    continue
                run.interrupted = signum
                run.halt("interrupted: the running items ended, the rest were not started")
                # On a line of its own: a progress bar may be drawn on the current one.
                again = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
                print(
                    f"\nbatch: interrupted; what runs is cancelled in {run.settings.grace:g} s"
                    f" ({again} again: now)",
                    file=sys.stderr,
                )
                tg.start_soon(_cancel_after, run, run.settings.grace)


async def _cancel_after(run: _Run, grace: float) -> None:
    await anyio.sleep(grace)
    run.cancel_running()


async def _manifest(run: _Run) -> None:
    while True:
        await anyio.sleep(_MANIFEST_EVERY)
        _write_manifest(run, "running")


def _write_manifest(run: _Run, state: str) -> None:
    c = run.counters
    with suppress(StoreError):  # a failed store is reported by the items' own writes
        run.journal.write_manifest(
            state=state,
            total=c.total,
            done=c.done,
            failed=c.failed,
            running=c.running,
            rate=round(c.rate(), 3),
            started_ms=run.journal.started_ms,
        )


def _plan(journal: BatchJournal, items: list[Item], s: Settings, tally: Tally) -> list[Item]:
    """The items to run; on resume, the results file made to agree with the store (the
    lines the store has and the file lacks are returned written)."""
    if s.resume == "fresh":
        return list(items)
    to_run: list[Item] = []
    keep: set[str] = set()
    for item in items:
        envelope = journal.envelope(item.id)
        if envelope is None or (s.resume == "retry-failed" and not envelope.ok):
            to_run.append(item)
        else:
            keep.add(item.id)
            tally.add(item.id, envelope, here=False)
    present = reconcile(s.out, keep)
    missing = keep - present
    if missing:
        sink = JsonlSink(s.out)
        try:
            for item in items:
                if item.id in missing:
                    envelope = journal.envelope(item.id)
                    if envelope is not None:
                        sink.write_line(line_of(item.id, envelope))
        finally:
            sink.close()
        if sink.error is not None:
            raise sink.error
    return to_run


async def run_batch(settings: Settings, items: Items, err: TextIO) -> int:
    """Run the batch; returns the exit status. Blocks until every admitted item is written.

    Raises:
        StoreError: the store cannot be opened, or failed before the run began.
        OSError: the results file cannot be read or rewritten before the run began.
    """
    started = time.monotonic()
    tally = Tally(total=len(items.items), malformed=len(items.malformed))
    for line, why in items.malformed:
        print(f"batch: input line {line}: {why} (not run)", file=err)
    async with SqliteStore(settings.store, commit_delay=_COMMIT_DELAY) as store:
        name = batch_name(settings.out, settings.store)
        journal = BatchJournal(store, name, fresh=settings.resume == "fresh")
        if settings.resume != "fresh" and not journal.found and _has_results(settings.out):
            # Without its journal the file's lines cannot be trusted or kept: refuse
            # rather than empty it and run everything again.
            print(
                f"subagents batch run: error: {settings.store} holds no batch for "
                f"{settings.out} (another --store? a removed .subagents?); nothing was run: "
                "point --store at its store, or remove the file and run without --resume",
                file=err,
            )
            return EXIT_USAGE
        to_run = _plan(journal, items.items, settings, tally)
        config = SubagentConfig(
            max_concurrent_spawns=settings.jobs,
            mailbox_capacity=settings.jobs + 64,
            retain_collected=0,
            # The spawn's timeout, then the agent's, then this: without --timeout an
            # agent's own watchdog holds.
            spawn_timeout=DEFAULT_TIMEOUT if settings.timeout is None else settings.timeout,
        )
        failures: list[Exception] = []
        results = ResultsFile(
            settings.out,
            order=[i.id for i in to_run] if settings.keep_order else None,
            on_error=failures.append,
        )
        # Open before the manager and closed after it: the events of its exit are written.
        sink = JsonlSink(settings.events) if settings.events else None
        try:
            async with SubagentManager(settings.specs, config=config) as manager:
                if sink is not None:
                    sink.attach(manager.events)  # detached by close()
                run = _Run(
                    settings=settings,
                    manager=manager,
                    journal=journal,
                    results=results,
                    tally=tally,
                    counters=Counters(len(items.items), tally.done, tally.failed),
                    total=len(to_run),
                    failures=failures,
                )
                status = await _drive(run, to_run, err)
        finally:
            if sink is not None:
                sink.close()
            results.close()
        try:
            await journal.wait_committed()
        except StoreError as exc:
            failures.append(exc)
    print_summary(tally, err, seconds=time.monotonic() - started, stopped=run.stopped)
    if failures:
        print(f"subagents batch run: {_describe(failures[0])}", file=err)
        # An interrupted run says so whatever else went wrong: a script that resumes
        # after Ctrl-C must not take it for a failure of its own.
        return status if run.interrupted is not None else 1
    return status


def _has_results(path: str) -> bool:
    try:
        return os.path.getsize(path) > 0
    except OSError:
        return False


def _describe(exc: Exception) -> str:
    if isinstance(exc, OSError):
        return f"writing the results failed: {exc.strerror or exc}"
    return str(exc)


async def _drive(run: _Run, to_run: list[Item], err: TextIO) -> int:
    progress = Progress(run.counters, choose_mode(run.settings.progress, err), err)
    _write_manifest(run, "running")
    try:
        async with anyio.create_task_group() as helpers:
            helpers.start_soon(_signals, run)
            helpers.start_soon(progress.run)
            helpers.start_soon(_manifest, run)
            await _admit(run, to_run)
            helpers.cancel_scope.cancel()
    finally:
        progress.finish()
    _write_manifest(run, "finished" if run.interrupted is None else "interrupted")
    return exit_status(run.tally, interrupted=run.interrupted)
