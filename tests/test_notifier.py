"""CompletionNotifier: mailbox put plus a full-envelope event; degrades, never blocks."""

from __future__ import annotations

import inspect
import logging

import anyio
import pytest

from subagents import (
    CompletionNotifier,
    DelegateResult,
    Mailbox,
    Request,
    RunContext,
    Status,
    SubagentManager,
)
from tests.helpers import manager_with, spec

Published = list[tuple[str, str, DelegateResult]]


def env(task_id: str) -> DelegateResult:
    return DelegateResult(
        agent="w",
        task_id=task_id,
        status=Status.ERROR,
        output="x" * 5000,  # full, untruncated
        error="boom",
        timestamp_ms=1,
    )


def make(
    mailboxes: dict[str, Mailbox], *, enabled: bool = True
) -> tuple[CompletionNotifier, Published]:
    published: Published = []
    notifier = CompletionNotifier(
        mailboxes.get, lambda *args: published.append(args), enabled=enabled
    )
    return notifier, published


def test_puts_and_publishes_full_envelope() -> None:
    box = Mailbox()
    notifier, published = make({"s": box})
    assert notifier.notify("s", "t1", env("t1")) is True
    assert box.peek("t1") == env("t1")
    assert published == [("subagent.completed", "s", env("t1"))]
    assert len(published[0][2].output) == 5000


def test_disabled_does_neither() -> None:
    box = Mailbox()
    notifier, published = make({"s": box}, enabled=False)
    assert notifier.notify("s", "t1", env("t1")) is False
    assert len(box) == 0
    assert published == []


def test_full_mailbox_degrades_to_event(caplog: pytest.LogCaptureFixture) -> None:
    box = Mailbox(capacity=1)
    box.put("old", env("old"))
    notifier, published = make({"s": box})
    with caplog.at_level(logging.DEBUG, logger="subagents.notifier"):
        assert notifier.notify("s", "t1", env("t1")) is False
    assert box.peek("old") == env("old")
    assert box.peek("t1") is None
    assert published == [
        ("subagent.mailbox_full", "s", env("t1")),
        ("subagent.completed", "s", env("t1")),
    ]
    assert notifier.overflows == 1
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]
    assert "mailbox full" in caplog.records[0].getMessage()


def test_missing_or_dropped_mailbox_still_publishes() -> None:
    dropped = Mailbox()
    dropped.drop()
    notifier, published = make({"gone": dropped})
    assert notifier.notify("nobody", "t1", env("t1")) is False
    assert notifier.notify("gone", "t2", env("t2")) is False
    assert [p[2].task_id for p in published] == ["t1", "t2"]


def test_failing_publish_or_mailbox_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    def bad_publish(*args: object) -> None:
        raise RuntimeError("bus down")

    def bad_lookup(session: str) -> Mailbox:
        raise RuntimeError("store down")

    box = Mailbox()
    with caplog.at_level(logging.ERROR):
        assert CompletionNotifier(lambda s: box, bad_publish).notify("s", "t", env("t"))
        assert CompletionNotifier(bad_lookup, None).notify("s", "t", env("t")) is False
    assert box.peek("t") == env("t")


@pytest.mark.anyio
async def test_notify_never_blocks_the_child() -> None:
    """notify is synchronous (it cannot await) and a full mailbox nobody reads does not
    hold the child: every child settles though no room is ever made."""
    assert not inspect.iscoroutinefunction(CompletionNotifier.notify)

    async def runner(request: Request, ctx: RunContext) -> str:
        return request.input

    async with manager_with(spec("w", runner), mailbox_capacity=1) as manager:
        handles = [manager.spawn("w", str(i)) for i in range(5)]
        with anyio.fail_after(5):
            for h in handles:
                await h.done.wait()  # ended, not collected: the mailbox keeps what fits
                assert h.result is not None
                assert h.result.output == h.request.input
        assert len(manager.mailbox()) == 1


@pytest.mark.anyio
async def test_manager_notifier_delivers_to_session_mailbox_and_event() -> None:
    async def runner(request: Request, ctx: RunContext) -> str:
        return "ok"

    events: list[object] = []
    async with manager_with(spec("w", runner)) as manager:
        manager.events.subscribe(lambda e: events.append(e) if e.type.endswith("ed") else None)
        handle = manager.spawn("w")
        await handle.done.wait()
        assert manager.mailbox().peek(handle.task_id) == handle.result
    completed = [e for e in events if getattr(e, "type", "") == "subagent.completed"]
    assert len(completed) == 1
    assert completed[0].data == handle.result.to_dict()  # type: ignore[attr-defined, union-attr]


@pytest.mark.anyio
async def test_manager_with_notify_disabled_neither_puts_nor_publishes() -> None:
    async def runner(request: Request, ctx: RunContext) -> str:
        return "ok"

    events: list[str] = []
    async with manager_with(spec("w", runner), notify_completion=False) as manager:
        manager.events.subscribe(lambda e: events.append(e.type))
        handle = manager.spawn("w")
        env_ = await handle.wait()
        assert env_.output == "ok"
        assert len(manager.mailbox()) == 0
        assert manager.result(handle.task_id) == env_  # still retrievable
    assert "subagent.completed" not in events


@pytest.mark.anyio
async def test_a_plain_batch_past_the_mailbox_capacity_warns_nothing_and_counts_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """200 results collected by id with a mailbox of 64: nothing is lost, so nothing is
    warned about; the overflow is counted and marked in the event stream."""

    async def runner(request: Request, ctx: RunContext) -> str:
        return request.input

    full: list[str] = []
    caplog.set_level(logging.DEBUG, logger="subagents")
    async with manager_with(spec("w", runner), max_concurrent_spawns=16) as manager:
        manager.events.subscribe(
            lambda e: full.append(e.task_id) if e.type == "subagent.mailbox_full" else None
        )
        handles = [manager.spawn("w", str(i)) for i in range(200)]
        for h in handles:
            await h.done.wait()
        outputs = [await manager.wait_result(h.task_id) for h in handles]
        assert [o.output for o in outputs if o is not None] == [str(i) for i in range(200)]
        assert manager.statistics().mailbox_overflows == 200 - 64
    assert len(full) == 200 - 64
    assert set(full) == {h.task_id for h in handles[64:]}
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("delivered by the completion event" in r.message for r in caplog.records)


@pytest.mark.anyio
async def test_the_mailbox_full_event_names_the_capacity_of_the_full_mailbox() -> None:
    async def runner(request: Request, ctx: RunContext) -> str:
        return request.input

    events: list[object] = []
    manager = SubagentManager(
        [spec("w", runner)], mailbox_factory=lambda session: Mailbox(capacity=2)
    )
    manager.events.subscribe(
        lambda e: events.append(e.data["capacity"]) if e.type == "subagent.mailbox_full" else None
    )
    async with manager:
        for h in [manager.spawn("w", str(i)) for i in range(3)]:
            await h.done.wait()
    assert events == [2]
