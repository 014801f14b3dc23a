"""``subagents.backends.command``: the command runner as a library, on asyncio and trio."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import anyio
import pytest

from subagents import AgentSpec, ConfigError, SubagentManager
from subagents.backends import _spawn
from subagents.backends.command import (
    CommandFailed,
    CommandRunner,
    MissingField,
    command_agent,
    fill_template,
)
from tests.batch.support import (
    ScopedRun,
    kill_pipe_holder,
    pipe_holder,
    wait_ended,
    wait_until,
)

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("process_start")]


def test_a_template_is_split_first_then_filled_one_word_per_field() -> None:
    runner = CommandRunner("grep -c {pattern} '{path}' {n}")
    item = {"pattern": "a b; rm -rf /", "path": "my file", "n": 3.0}
    assert runner.argv(item) == ["grep", "-c", "a b; rm -rf /", "my file", "3"]
    assert runner.fields == {"pattern", "path", "n"}


def test_a_template_fills_json_for_structures_and_keeps_other_braces() -> None:
    assert fill_template("{a} {b} {c} {print $1}", {"a": [1], "b": None, "c": True}) == (
        "[1]  true {print $1}"
    )
    with pytest.raises(KeyError, match="no field 'missing'"):
        fill_template("x {missing}", {})
    with pytest.raises(ConfigError, match="command"):
        CommandRunner("  ")


async def test_the_output_is_stdout_and_a_failure_carries_the_code_and_stderr() -> None:
    agents = [
        command_agent(["sh", "-c", "cat; echo done >&2"], name="cat"),
        command_agent("sh -c 'echo {why} >&2; exit 4'", name="fail"),
    ]
    async with SubagentManager(agents) as manager:
        ok = await manager.execute("cat", '{"k": "v"}')
        bad = await manager.execute("fail", '{"why": "broken"}')
    assert (ok.status.value, ok.output) == ("completed", '{"k": "v"}')
    assert bad.status.value == "error"
    assert bad.error_type == "subagents.backends.command.CommandFailed"
    assert bad.error.endswith("failed with exit code 4; stderr: broken")


async def test_a_plain_text_input_is_the_item_input_field() -> None:
    async with SubagentManager([command_agent("echo {input}")]) as manager:
        result = await manager.execute("command", "not json")
    assert result.output == "not json\n"


async def test_cancelling_a_run_ends_its_process_group_even_past_sigterm(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = f"trap '' TERM; sleep 60 & echo $$ $! > {pids}; wait; wait"
    runner = CommandRunner(["sh", "-c", script], grace=0.1)
    spec = AgentSpec(name="stubborn", runner=runner)
    async with SubagentManager([spec]) as manager:
        handle = manager.spawn("stubborn", "{}")
        # The file is how the shell says it has started both (another process: no event).
        started = lambda: pids.exists() and len(pids.read_text().split()) == 2  # noqa: E731
        await anyio.to_thread.run_sync(wait_until, started, "the pids")
        handle.cancel()
        envelope = await handle.wait()
    assert envelope.status.value == "cancelled"
    ended = [int(p) for p in pids.read_text().split()]
    await anyio.to_thread.run_sync(wait_ended, ended)


async def test_run_returns_the_exit_of_a_command_killed_by_a_signal() -> None:
    runner = CommandRunner("sh -c 'kill -9 $$'")
    output, code, _ = await runner.run(runner.argv({}), b"")
    assert (output, code) == ("", -9)
    failure = CommandFailed(runner.argv({}), code, "")
    assert "signal 9" in str(failure)


def test_doubled_braces_are_literal_braces_and_no_field() -> None:
    runner = CommandRunner("awk '/x/{{next}} {{print {col}}}'")
    assert runner.fields == {"col"}
    assert runner.argv({"col": "$2"}) == ["awk", "/x/{next} {print $2}"]


def test_a_missing_field_is_a_key_error_whose_message_names_it_unquoted() -> None:
    with pytest.raises(MissingField) as caught:
        fill_template("cat {path}", {"other": 1})
    assert isinstance(caught.value, KeyError)
    assert caught.value.field == "path"
    assert str(caught.value) == "the item has no field 'path' for {path}"


async def test_an_exit_whose_stdout_stays_open_past_the_bound_is_an_error_keeping_the_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A descendant in a session of its own holds stdout: the group's SIGKILL misses it, so
    # the drain gives up at the bound, and what was read may be only part of the output.
    monkeypatch.setattr(_spawn, "REAP_TIMEOUT", 0.2)
    pid_file = tmp_path / "pid"
    leaver = (
        "import os, sys, time; os.setsid(); "
        f"open({str(pid_file) + '.tmp'!r}, 'w').write(str(os.getpid())); "
        f"os.rename({str(pid_file) + '.tmp'!r}, {str(pid_file)!r}); time.sleep(30)"
    )
    script = f'"$1" -c "$2" & while [ ! -s {pid_file} ]; do sleep 0.01; done; echo hi'
    agent = command_agent(["sh", "-c", script, "sh", sys.executable, leaver])
    try:
        async with SubagentManager([agent]) as manager:
            result = await manager.execute("command", "{}")
    finally:
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert (result.status.value, result.output) == ("error", "hi\n")
    assert "stdout was still open" in result.error


async def test_a_command_that_exits_leaving_a_child_on_its_stdout_returns_at_its_exit(
    tmp_path: Path,
) -> None:
    # The module promises that after a normal exit the group is signalled, "which ends
    # the background processes the command left"; a run that drained stdout to EOF first
    # would hang while the background child holds it open (or the watchdog would turn a
    # command that exited 0 into a timeout).
    pid_file = tmp_path / "pid"
    runner = CommandRunner(["sh", "-c", f"sleep 30 & echo $! > {pid_file}; echo hi"], grace=0.1)
    with anyio.fail_after(5):  # a bound on a hang only: the run returns at once
        output, code, _ = await runner.run(runner.argv({}), b"")
    assert (output, code) == ("hi\n", 0)
    await anyio.to_thread.run_sync(wait_ended, [int(pid_file.read_text())])


def test_an_unbalanced_quote_in_a_template_is_a_config_error_naming_command() -> None:
    # Not shlex's bare ValueError("No closing quotation"), which the CLI would print as
    # a traceback for --command "echo 'oops".
    with pytest.raises(ConfigError, match="command"):
        CommandRunner("echo 'oops")


def test_a_negative_retries_is_a_config_error_naming_retries() -> None:
    # Not RetryPolicy's "attempts", a parameter the caller never passed.
    with pytest.raises(ConfigError, match="retries"):
        command_agent("true", retries=-1)


def test_a_float_field_is_filled_as_json_not_as_the_digits_of_its_integer() -> None:
    # "anything else as JSON": 1e300 is "1e300", not a 301-digit integer nobody wrote.
    filled = fill_template("{x}", {"x": 1e300})
    assert float(filled) == 1e300
    assert len(filled) < 30, filled[:40]


async def test_a_stderr_tail_of_zero_keeps_no_stderr() -> None:
    # keep = 0 is a trap of slicing: `del into[:-0]` deletes nothing and `text[-0:]` is
    # the whole text, which would keep all of stderr, unbounded.
    runner = CommandRunner("sh -c 'echo noisy >&2; exit 3'", stderr_tail=0)
    _, code, tail = await runner.run(runner.argv({}), b"")
    assert (code, tail) == (3, "")


def test_nested_closing_braces_of_a_template_that_holds_no_field_stay_as_written() -> None:
    # Single braces around anything but a name are kept (``awk '{print $1}'``), so a jq
    # filter or a JSON literal reads as written; two adjacent closing braces too, which
    # collapsed into one would silently turn valid jq or JSON into a syntax error.
    assert fill_template("{a: {b: .x}}", {}) == "{a: {b: .x}}"
    assert fill_template('{"a":{"b":1}}', {}) == '{"a":{"b":1}}'


async def test_a_run_cancelled_before_its_exit_does_not_wait_for_a_pipe_held_past_it(
    tmp_path: Path,
) -> None:
    # A descendant in a session of its own holds stdout. The run is cancelled while the
    # command runs: its group ends within the grace, and nobody reads the output of a
    # cancelled run, so the run must not then drain the held pipe for REAP_TIMEOUT (as a
    # run cancelled after the exit does not).
    pid = tmp_path / "pid"
    script = f"{pipe_holder(pid)} sleep 30"
    runner = CommandRunner(["sh", "-c", script], grace=0.1)
    cut = ScopedRun(runner)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(cut.run)
            await anyio.to_thread.run_sync(wait_until, pid.exists, "the descendant's pid")
            await cut.cancel_and_wait(_spawn.REAP_TIMEOUT / 2)
            assert cut.returned.is_set(), "the cancelled run drained the held pipe to its bound"
    finally:
        kill_pipe_holder(pid)
