"""The command's process on the pidfd path (its whole life in a worker thread): what a
cancellation before the start, during it, or while the pipes drain after the exit gets."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from subagents.backends import _spawn
from subagents.backends.command import CommandRunner
from tests.batch.support import (
    ScopedRun,
    kill_pipe_holder,
    pipe_holder,
    wait_ended,
    wait_until,
)

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not _spawn.AVAILABLE, reason="no pidfds on this platform"),
]


async def test_a_run_cancelled_while_the_default_thread_limiter_is_full_returns_at_once() -> None:
    # A runner's blocking work in anyio.to_thread (as AgentSpec's docs advise) can hold
    # every token of the default limiter; a command's watchdog must still end its run.
    limiter = anyio.to_thread.current_default_thread_limiter()
    release = threading.Event()
    runner = CommandRunner(["true"])
    cut = ScopedRun(runner)

    async with anyio.create_task_group() as tg:
        try:
            for _ in range(int(limiter.total_tokens)):
                tg.start_soon(anyio.to_thread.run_sync, release.wait)
            await anyio.wait_all_tasks_blocked()
            assert limiter.available_tokens == 0
            tg.start_soon(cut.run)
            await anyio.wait_all_tasks_blocked()
            await cut.cancel_and_wait(1)  # the pass is immediate
            assert cut.returned.is_set(), "the cancelled run waited for another task's thread"
        finally:
            release.set()


def test_a_run_stopped_before_its_thread_begins_starts_nothing(tmp_path: Path) -> None:
    # A cancellation that reaches the run before a worker thread took it up: the
    # thread, when it comes, must start no process (nobody would end it).
    marker = tmp_path / "started"
    job = _spawn._Job(
        _spawn._Command(["touch", str(marker)], memoryview(b""), None, None, None, 0.1)
    )
    assert job.stop() is False, "no thread runs it: nothing to wait for"
    assert job.ended.is_set()
    with pytest.raises(_spawn._GivenUp):
        job.run()
    assert not marker.exists()


async def test_a_run_cancelled_while_its_pipes_drain_after_the_exit_ends_at_once(
    tmp_path: Path,
) -> None:
    # A descendant in a session of its own holds stdout past the command's exit: the
    # run drains it for up to REAP_TIMEOUT, but a cancellation ends that wait at once.
    # The shell exits only once the descendant is in its new session.
    held_file, shell_file = tmp_path / "held", tmp_path / "shell"
    script = (
        f"{pipe_holder(held_file)} while [ ! -s {held_file} ]; do sleep 0.01; done; "
        f"echo $$ > {shell_file}.tmp; mv {shell_file}.tmp {shell_file}"
    )
    runner = CommandRunner(["sh", "-c", script], grace=0.1)
    cut = ScopedRun(runner)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(cut.run)
            await anyio.to_thread.run_sync(wait_until, shell_file.exists, "the shell's pid")
            shell = int(shell_file.read_text())
            await anyio.to_thread.run_sync(wait_ended, [shell])  # exited and reaped
            await cut.cancel_and_wait(_spawn.REAP_TIMEOUT / 2)
            assert cut.returned.is_set(), "the cancelled run waited for the held pipe's bound"
    finally:
        kill_pipe_holder(held_file)


async def test_a_run_cancelled_after_its_thread_failed_to_begin_ends_cancelled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The thread's first step (its stop eventfd) fails, as it does with no descriptor
    # left (EMFILE), and a cancellation reaches the run meanwhile: the run must end as
    # cancelled, not stop a thread that never got its eventfd (or wait for its end).
    entered = threading.Event()
    release = threading.Event()

    def no_descriptor_left(*_: object) -> int:
        entered.set()
        release.wait()
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(_spawn.os, "eventfd", no_descriptor_left)
    scope = anyio.CancelScope()
    ended = anyio.Event()

    async def run() -> None:
        with scope:
            await _spawn.run_command(["true"], b"", cwd=None, env=None, stderr_keep=None, grace=0.1)
        ended.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await anyio.to_thread.run_sync(entered.wait)
        scope.cancel()
        release.set()  # the thread raises; the cancelled run then stops it
        with anyio.move_on_after(5):  # bounds the failure only: the pass is immediate
            await ended.wait()
    assert ended.is_set(), "the cancelled run did not end"
    assert scope.cancelled_caught
