"""``take_all`` among puts, overwrites, drains, discards and cancellations (hypothesis): a
take that waits for the writer never hands out an envelope twice, nor one put after its
call, nor one its call found overwritten, nor one discarded (even after the take was
submitted); a discard consumes only what its call found; and the newest envelope of every
id reaches exactly one consumer, whatever was cancelled on the way; the ``committed`` hook
reports exactly the puts written (all but those overwritten in the writer's queue with no
take between)."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import anyio
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from subagents import DelegateResult
from subagents.store import SqliteMailbox, SqliteStore
from tests.store.support import env
from tests.store.test_store_lifecycle import writer_parked

KEYS = ("a", "b")
Op = tuple[str, str]

# Puts, takes and settles weigh more: an overwrite matters between a commit and a take.
_OPS = st.lists(
    st.sampled_from(
        [
            *(("put", key) for key in (*KEYS, *KEYS, "a")),
            *(("drain", key) for key in KEYS),
            *(("discard", key) for key in KEYS),
            *((op, "") for op in ("drain_all", "take", "take", "cancel", "settle", "settle")),
        ]
    ),
    max_size=24,
)


class Run:
    """The operations on one mailbox, and what each consumer was handed."""

    def __init__(self, box: SqliteMailbox, go: threading.Event) -> None:
        self.box = box
        self.go = go
        self.puts = 0
        self.latest: dict[str, str] = {}  # the newest output put for each id
        self.handed: list[str] = []
        self.discarded: set[str] = set()  # handed to nobody by a discard
        self.takes: list[tuple[anyio.CancelScope, list[object]]] = []
        self.running = 0
        self.idle = anyio.Event()
        # What the writer is to write: the ops since the last settle are in its queue.
        self.step = 0  # the op's place in the run (a put's, a take's)
        self.epoch = 0  # settles so far
        self.unwritten: dict[str, tuple[str, int]] = {}  # key -> (output, step) in queue
        self.overwritten: list[tuple[str, int, int, int]] = []  # (output, step, by, epoch)
        self.queued_takes: list[list[object]] = []  # [step, epoch, withdrawn]
        self.outputs: list[str] = []
        self.reported: list[str] = []
        box.committed = lambda envelope: self.reported.append(envelope.output)

    def written(self) -> set[str]:
        """The outputs the writer writes: all but those overwritten in its queue with no
        take between the two (a withdrawn take does not count)."""
        never = {
            output
            for output, step, by, epoch in self.overwritten
            if not any(
                t_epoch == epoch and step < t_step < by and not withdrawn
                for t_step, t_epoch, withdrawn in self.queued_takes
            )
        }
        return set(self.outputs) - never

    def hand(self, got: list[DelegateResult], *, latest_at_call: dict[str, str]) -> None:
        """Outputs handed out: each was the newest of its id when the consumer was called,
        and not discarded (a discard leaves the entry to no take, not even one submitted
        before it: the writer is parked between settles, so none is under way)."""
        for envelope in got:
            assert envelope.output == latest_at_call.get(envelope.task_id), (
                f"{envelope.output} was not the newest of {envelope.task_id} at the call"
            )
            assert envelope.output not in self.discarded, f"{envelope.output} was discarded"
            self.handed.append(envelope.output)

    async def take(self, scope: anyio.CancelScope) -> None:
        latest_at_call = dict(self.latest)
        try:
            with scope:
                self.hand(await self.box.take_all(), latest_at_call=latest_at_call)
        finally:
            self.running -= 1
            if not self.running:
                self.idle.set()

    async def settle(self) -> None:
        """Let the writer commit everything, the takes included."""
        self.go.set()
        await self.box.wait_committed()
        if self.running:
            await self.idle.wait()
        self.go.clear()

    async def play(self, ops: list[Op], tg: anyio.abc.TaskGroup) -> None:
        for op, key in ops:
            self.step += 1
            if op == "put":
                self.puts += 1
                output = f"{key}{self.puts}"
                self.box.put(key, env(key, output))
                self.latest[key] = output
                self.outputs.append(output)
                if key in self.unwritten:
                    old, step = self.unwritten[key]
                    self.overwritten.append((old, step, self.step, self.epoch))
                self.unwritten[key] = (output, self.step)
            elif op == "drain":
                got = self.box.drain(key)
                self.hand([] if got is None else [got], latest_at_call=self.latest)
                self.unwritten.pop(key, None)  # consumed here if queued: written as read
            elif op == "discard":
                found = self.box.peek(key)  # what the discard is to consume
                self.box.discard(key)
                if found is not None:
                    self.discarded.add(found.output)
                self.unwritten.pop(key, None)  # consumed here if queued: written as read
            elif op == "drain_all":
                self.hand(self.box.drain_all(), latest_at_call=self.latest)
                self.unwritten.clear()
            elif op == "take":
                scope = anyio.CancelScope()
                model: list[object] = [self.step, self.epoch, False]
                self.queued_takes.append(model)
                self.takes.append((scope, model))
                if not self.running:
                    self.idle = anyio.Event()
                self.running += 1
                tg.start_soon(self.take, scope)
                await anyio.wait_all_tasks_blocked()  # submitted, waiting for the writer
            elif op == "cancel" and self.takes:
                scope, model = self.takes.pop(0)
                model[2] = model[1] == self.epoch  # still queued: withdrawn
                scope.cancel()
                await anyio.wait_all_tasks_blocked()
            elif op == "settle":
                await self.settle()
                self.epoch += 1
                self.unwritten.clear()
        await self.settle()
        self.hand(self.box.drain_all(), latest_at_call=self.latest)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=_OPS)
# An overwrite after a take was submitted, of an envelope put before it (the take takes
# that one, never the one it overwrote); a take cancelled while queued.
@example(ops=[("put", "a"), ("settle", ""), ("put", "a"), ("take", ""), ("put", "a")])
@example(ops=[("put", "a"), ("take", ""), ("cancel", ""), ("put", "a"), ("take", "")])
# A take withdrawn between a put and its overwrite, another take after both.
@example(ops=[("put", "a"), ("take", ""), ("put", "a"), ("take", ""), ("cancel", "")])
# A discard of a committed entry, then a put of its id before the discard commits; a take
# submitted before a discard, which leaves it the entry.
@example(ops=[("put", "a"), ("settle", ""), ("discard", "a"), ("put", "a"), ("take", "")])
@example(ops=[("put", "a"), ("settle", ""), ("take", ""), ("discard", "a"), ("settle", "")])
def test_takes_among_puts_drains_and_cancellations_hand_each_newest_envelope_once(
    tmp_path_factory: pytest.TempPathFactory, empty_store: Path, backend: str, ops: list[Op]
) -> None:
    path = tmp_path_factory.mktemp("takes") / "s.db"
    shutil.copy(empty_store, path)

    async def main() -> Run:
        async with SqliteStore(path) as store:
            with writer_parked(store) as go:
                run = Run(store.mailbox("s"), go)
                with anyio.fail_after(30):  # a lost wake-up fails, not hangs
                    async with anyio.create_task_group() as tg:
                        await run.play(ops, tg)
            return run

    run = anyio.run(main, backend=backend)
    assert len(run.handed) == len(set(run.handed)), f"handed out twice: {run.handed}"
    lost = set(run.latest.values()) - set(run.handed) - set(run.discarded)
    assert not lost, f"never handed out: {lost}"
    assert len(run.reported) == len(set(run.reported)), f"reported twice: {run.reported}"
    assert set(run.reported) == run.written(), "the committed hook is not what was written"
