"""Waiting receives and the watcher: a commit by another connection wakes a wait, also
one that began before the watcher's thread read ``data_version`` for the first time."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import anyio
import anyio.from_thread
import anyio.to_thread
import pytest

from subagents.room import Message, Room, Sent, _lifecycle, _messages
from subagents.store._watch import Watcher

pytestmark = pytest.mark.anyio


async def test_a_wait_begun_before_the_watchers_first_read_finds_a_commit_made_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A send another connection commits after a waiting peek looked, while the watcher's
    thread has not run yet, wakes the peek: the version the watcher compares with was
    read before the room opened, not when the thread got to run (which would hold the
    send, and no later change comes: a bridge's first question, lost in CI)."""
    path = tmp_path / "s.db"
    loop = threading.current_thread()
    watching, first_read, read = threading.Event(), threading.Event(), threading.Event()

    class Late(Watcher):
        """A watcher whose thread, if it reads the first version, does so only when the
        test says (a loaded machine: the thread first runs after the send below)."""

        def watch(self, active: bool) -> None:
            if active:
                watching.set()
            super().watch(active)

        def _version(self) -> int:
            first = self.polls == 0
            if first and threading.current_thread() is not loop:
                first_read.wait(20)
            version = super()._version()
            if first:
                read.set()
            return version

    async with Room(path) as other:
        sender = (await other.join()).member_id
        monkeypatch.setattr(_lifecycle, "Watcher", Late)
        async with Room(path) as room:
            member = (await room.join()).member_id
            peek, sent = _messages.peek, list[Sent]()

            def looked(
                raw: sqlite3.Connection, who: str, after: int | None, limit: int, now: float
            ) -> list[Message]:
                found = peek(raw, who, after, limit, now)
                if watching.is_set() and not sent:  # the look of a registered wait
                    assert not found
                    sent.append(anyio.from_thread.run(other.send, sender, member, "hello"))
                    first_read.set()  # read now, the first version holds the send
                    read.wait(20)
                return found

            monkeypatch.setattr(_messages, "peek", looked)
            with anyio.fail_after(10):
                got = await room.peek(member, timeout=None)
            assert sent
            assert [m.body for m in got] == ["hello"]


async def test_a_read_only_rooms_timed_peek_is_woken_by_another_rooms_send(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only room has a watcher of its own: its waiting peek ends at the send, not at
    its deadline."""
    path = tmp_path / "s.db"
    peek, looked = _messages.peek, threading.Event()

    def peeked(
        raw: sqlite3.Connection, who: str, after: int | None, limit: int, now: float
    ) -> list[Message]:
        found = peek(raw, who, after, limit, now)
        if not found:
            looked.set()  # the wait is registered before it looks
        return found

    monkeypatch.setattr(_messages, "peek", peeked)
    async with Room(path) as writer, Room(path, read_only=True) as reader:
        sender = (await writer.join()).member_id
        member = (await writer.join()).member_id
        got: list[Message] = []

        async def look() -> None:
            got.extend(await reader.peek(member, timeout=60))

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(look)
                await anyio.to_thread.run_sync(looked.wait)
                await writer.send(sender, member, "hello")
        assert [m.body for m in got] == ["hello"]
