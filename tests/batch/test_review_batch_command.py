"""Review of ``subagents.backends.command``: templating, bad templates, a run's end."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from subagents import ConfigError
from subagents.backends.command import CommandRunner, command_agent, fill_template
from tests.batch.support import wait_ended

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("process_start")]


async def test_a_command_that_exits_leaving_a_child_on_its_stdout_returns_at_its_exit(
    tmp_path: Path,
) -> None:
    # The module promises that after a normal exit the group is signalled, "which ends
    # the background processes the command left"; today the run first drains stdout to
    # EOF, which the background child holds open: the run hangs until it ends (or the
    # watchdog turns a command that exited 0 into a timeout).
    pid_file = tmp_path / "pid"
    runner = CommandRunner(["sh", "-c", f"sleep 30 & echo $! > {pid_file}; echo hi"], grace=0.1)
    with anyio.fail_after(5):  # a bound on the hang only: a fixed run returns at once
        output, code, _ = await runner.run(runner.argv({}), b"")
    assert (output, code) == ("hi\n", 0)
    await anyio.to_thread.run_sync(wait_ended, [int(pid_file.read_text())])


def test_an_unbalanced_quote_in_a_template_is_a_config_error_naming_command() -> None:
    # Today shlex's bare ValueError("No closing quotation") escapes (and the CLI prints a
    # traceback for --command "echo 'oops").
    with pytest.raises(ConfigError, match="command"):
        CommandRunner("echo 'oops")


def test_a_negative_retries_is_a_config_error_naming_retries() -> None:
    # Today the error names RetryPolicy's "attempts", a parameter the caller never passed.
    with pytest.raises(ConfigError, match="retries"):
        command_agent("true", retries=-1)


def test_a_float_field_is_filled_as_json_not_as_the_digits_of_its_integer() -> None:
    # "anything else as JSON": 1e300 is "1e300", not a 301-digit integer nobody wrote.
    filled = fill_template("{x}", {"x": 1e300})
    assert float(filled) == 1e300
    assert len(filled) < 30, filled[:40]


async def test_a_stderr_tail_of_zero_keeps_no_stderr() -> None:
    # keep = 0: `del into[:-0]` deletes nothing and `text[-0:]` is the whole text, so 0
    # keeps all of stderr, unbounded, where 2000 keeps 2000 characters.
    runner = CommandRunner("sh -c 'echo noisy >&2; exit 3'", stderr_tail=0)
    _, code, tail = await runner.run(runner.argv({}), b"")
    assert (code, tail) == (3, "")
