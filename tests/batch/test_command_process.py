"""The command runner's process, through a pidfd and through ``anyio.open_process``:
descriptors, a missing command, large pipes, signals, and which path runs when."""

from __future__ import annotations

import errno
import os
import re
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from subagents import SubagentManager
from subagents.backends import _spawn
from subagents.backends.command import CommandRunner, command_agent
from tests.batch.support import wait_ended, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("process_start")]

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="/proc/self/fd")


def _open_fds() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/fd")}


@linux_only
async def test_runs_that_pass_fail_are_missing_or_cancelled_leave_no_descriptor_open(
    tmp_path: Path,
) -> None:
    runner = CommandRunner(["sh", "-c", "cat; echo err >&2; exit $0"], grace=0.1)
    await runner.run(["true"], b"")  # the event loop's own descriptors open on first use
    before = _open_fds()
    for code in ("0", "3"):
        await runner.run([*runner.argv({}), code], b"x" * 100)
    with pytest.raises(FileNotFoundError):
        await runner.run(["no-such-command-subagents"], b"")
    started = tmp_path / "started"
    with anyio.move_on_after(30) as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(runner.run, ["sh", "-c", f"touch {started}; sleep 60"], b"")
            await anyio.to_thread.run_sync(wait_until, started.exists, "the command")
            tg.cancel_scope.cancel()
    assert not scope.cancelled_caught
    assert _open_fds() - before == set()


async def test_a_command_not_found_is_an_error_envelope_naming_it() -> None:
    async with SubagentManager([command_agent("no-such-command-subagents {x}")]) as manager:
        result = await manager.execute("command", '{"x": 1}')
    assert result.status.value == "error"
    assert result.error_type == "FileNotFoundError"
    assert "no-such-command-subagents" in result.error


async def test_a_stdout_and_a_stdin_far_larger_than_a_pipe_pass_whole() -> None:
    size = 4 * 1024 * 1024  # 64 pipe buffers each way: both sides block many times
    data = bytes(range(256)) * (size // 256)
    runner = CommandRunner(["sh", "-c", f"cat; head -c {size} /dev/zero"])
    stdout, code, _ = await runner.run(runner.argv({}), data)
    assert code == 0
    assert len(stdout) == len(data.decode("utf-8", "replace")) + size
    assert stdout.endswith("\x00" * size)


async def test_an_inheritable_descriptor_of_this_process_is_not_the_commands() -> None:
    read_end, write_end = os.pipe()
    os.set_inheritable(write_end, True)
    try:
        # Not sh's `>&N`: dash reads one digit only, and pytest's descriptors pass 9.
        writes = "import os, sys; os.write(int(sys.argv[1]), b'leaked')"
        runner = CommandRunner([sys.executable, "-I", "-S", "-c", writes, str(write_end)])
        _, code, stderr = await runner.run(runner.argv({}), b"")
    finally:
        os.close(write_end)
    try:
        assert os.read(read_end, 100) == b""  # the only writer is closed: nothing came
    finally:
        os.close(read_end)
    assert code != 0, "the command wrote to a descriptor it should never have had"
    assert stderr


async def test_the_command_gets_sigpipe_at_its_default_though_python_ignores_it() -> None:
    runner = CommandRunner(["sh", "-c", "kill -PIPE $$; echo survived"])
    stdout, code, _ = await runner.run(runner.argv({}), b"")
    assert (stdout, code) == ("", -13)


async def test_a_command_that_exits_at_once_without_reading_its_stdin_is_no_error() -> None:
    runner = CommandRunner(["true"])
    _, code, _ = await runner.run(["true"], b"y" * (1024 * 1024))
    assert code == 0


async def test_a_group_ignoring_sigterm_is_killed_on_cancel_and_none_of_it_outlives_the_run(
    tmp_path: Path,
) -> None:
    pids = tmp_path / "pids"
    script = f"trap '' TERM; sleep 60 & echo $$ $! > {pids}.tmp; mv {pids}.tmp {pids}; wait"
    runner = CommandRunner(["sh", "-c", script], grace=0.1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(runner.run, runner.argv({}), b"")
        await anyio.to_thread.run_sync(wait_until, pids.exists, "the pids")
        tg.cancel_scope.cancel()
    await anyio.to_thread.run_sync(wait_ended, [int(p) for p in pids.read_text().split()])


async def test_the_path_is_the_pidfd_one_on_linux_with_or_without_a_cwd(
    process_start: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spawned: list[list[str]] = []
    real = _spawn.run_command

    async def spy(argv: list[str], stdin: bytes, **options: Any) -> _spawn.Outcome:
        spawned.append(list(argv))
        return await real(argv, stdin, **options)

    monkeypatch.setattr(_spawn, "run_command", spy)
    here, _, _ = await CommandRunner(["pwd"]).run(["pwd"], b"")
    elsewhere, _, _ = await CommandRunner(["pwd"], cwd=tmp_path).run(["pwd"], b"")
    there = str(await anyio.Path(tmp_path).resolve())
    assert (here.strip(), elsewhere.strip()) == (os.getcwd(), there)
    assert spawned == ([["pwd"], ["pwd"]] if process_start == "pidfd" else [])
    if sys.platform == "linux":
        assert _spawn.AVAILABLE or process_start == "open_process"


async def test_the_environment_given_is_the_commands_and_its_path_finds_the_executable(
    tmp_path: Path,
) -> None:
    tool = tmp_path / "only-here-subagents"
    tool.write_text('#!/bin/sh\necho "found $MARK"\n')
    tool.chmod(0o755)
    env = {"PATH": f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}", "MARK": "yes"}
    stdout, code, _ = await CommandRunner([tool.name], env=env).run([tool.name], b"")
    assert (stdout, code) == ("found yes\n", 0)


@pytest.mark.skipif(sys.platform != "linux", reason="pidfds are Linux's")
def test_a_linux_kernel_with_pidfds_runs_the_pidfd_path() -> None:
    # The fixture skips the pidfd case where pidfds are missing: without this, a Linux
    # machine that fell back quietly would still pass every runner test.
    release = tuple(int(part) for part in re.findall(r"\d+", os.uname().release)[:2])
    if release >= (5, 3):
        assert _spawn._pidfds_work()  # the probe itself: the module patches AVAILABLE


def _exited(*argv: str) -> tuple[subprocess.Popen[bytes], int]:
    """A child run to its exit, unreaped, and its pidfd."""
    child = subprocess.Popen(argv)
    pidfd = os.pidfd_open(child.pid)
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    assert poller.poll(10_000), "the child did not exit"
    return child, pidfd


def _pidfd_waitid_works() -> bool:
    if not _spawn._waitid_pidfd:
        return False
    child, pidfd = _exited("true")
    try:
        os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
    except OSError:  # a kernel without P_PIDFD
        os.waitpid(child.pid, 0)
        return False
    finally:
        child.returncode = 0
        os.close(pidfd)
    return True


@pytest.mark.skipif(not _spawn.AVAILABLE, reason="pidfds are Linux 5.3's")
@pytest.mark.parametrize("through_pidfd", [True, False], ids=["waitid-pidfd", "waitpid"])
def test_the_reap_gives_the_exit_code_and_a_signal_as_its_negative(
    through_pidfd: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_spawn, "_waitid_pidfd", through_pidfd and _spawn._waitid_pidfd)
    for argv, code in [(("sh", "-c", "exit 3"), 3), (("sh", "-c", "kill -9 $$"), -9)]:
        child, pidfd = _exited(*argv)
        try:
            assert _spawn.reaped(child.pid, pidfd) == code
            with pytest.raises(ChildProcessError):
                _spawn.reaped(child.pid, pidfd)
        finally:
            child.returncode = code
            os.close(pidfd)


@pytest.mark.skipif(not _spawn.AVAILABLE, reason="pidfds are Linux 5.3's")
def test_a_kernel_without_waitid_on_a_pidfd_is_asked_once_then_reaped_by_pid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[int] = []

    def waitid_of_linux_5_3(idtype: int, ident: int, options: int) -> None:
        asked.append(ident)
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(_spawn, "_waitid_pidfd", True)
    monkeypatch.setattr(_spawn.os, "waitid", waitid_of_linux_5_3)
    for code in (6, 7):
        child, pidfd = _exited("sh", "-c", f"exit {code}")
        try:
            assert _spawn.reaped(child.pid, pidfd) == code
        finally:
            child.returncode = code
            os.close(pidfd)
    assert len(asked) == 1
    assert _spawn._waitid_pidfd is False


@pytest.mark.skipif(not (_spawn.AVAILABLE and _pidfd_waitid_works()), reason="Linux 5.4's")
def test_a_reap_through_the_pidfd_takes_that_process_whatever_pid_it_is_given() -> None:
    # The pid is what a reap by pid would trust: once reaped elsewhere, it may name
    # another child of ours. Through the pidfd, the pid given does not matter.
    first, first_fd = _exited("sh", "-c", "exit 4")
    other, other_fd = _exited("sh", "-c", "exit 5")
    try:
        assert _spawn.reaped(other.pid, first_fd) == 4
        assert os.waitstatus_to_exitcode(os.waitpid(other.pid, 0)[1]) == 5, "left unreaped"
    finally:
        first.returncode, other.returncode = 4, 5
        os.close(first_fd)
        os.close(other_fd)
