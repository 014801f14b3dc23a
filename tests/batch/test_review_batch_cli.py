"""Review of ``subagents batch run`` end to end: the batch's own death, resume's journal,
bad command templates."""

from __future__ import annotations

import os
import signal
from contextlib import suppress
from pathlib import Path

import attrs

from tests.batch.agents import ECHO
from tests.batch.support import (
    alive,
    batch,
    by_id,
    runs_of,
    start,
    wait_ended,
    wait_until,
    write_jsonl,
)

AGENT = "tests.batch.agents:ECHO"
SHORT = attrs.evolve(ECHO, name="short", timeout=0.2)
"""``--agent tests.batch.test_review_batch_cli:SHORT``: echo with a watchdog of its own."""
_SCRIPT = 'read -r item; echo $$ >> "$1"; sleep 60 & echo $! >> "$1"; wait'
"""Reads its item first: the runner hands the group to the warden before it writes the
item, so a kill after the pids are written is never in the set-up window that
design/batch.md leaves uncovered (a command killed with its batch before that)."""


def _started(pids: Path) -> bool:
    return pids.exists() and len(pids.read_text().split()) == 2


def _ended_else_killed(pids: Path) -> None:
    """Wait for the command's processes to end; kill the survivors (the test's own) if
    they do not, so a failing run leaves nothing behind."""
    started = [int(p) for p in pids.read_text().split()]
    try:
        wait_ended(started, timeout=5)
    except AssertionError:
        for pid in alive(started):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        raise


def _command_batch(tmp_path: Path) -> tuple[Path, list[str]]:
    pids = tmp_path / "pids"
    write_jsonl(tmp_path / "items.jsonl", [{"id": "long", "pids": str(pids)}])
    args = [
        "run", "--input", "items.jsonl", "--out", "out.jsonl", "--id-field", "id",
        "--command", f"sh -c '{_SCRIPT}' sh {{pids}}", "--grace", "0.1", "--progress", "none",
    ]  # fmt: skip
    return pids, args


def test_a_sigkilled_batch_leaves_no_command_process_running(tmp_path: Path) -> None:
    # Each command leads a session of its own (so a terminal's Ctrl-C reaches the batch
    # alone); nothing ends that session when the batch itself is killed, so the shell
    # and its sleep run on, orphaned, and a --resume runs the item a second time beside
    # them. (A fix: PR_SET_PDEATHSIG, or a pipe whose EOF tells the group to end.)
    pids, args = _command_batch(tmp_path)
    process = start(*args, cwd=tmp_path)
    wait_until(lambda: _started(pids), "the command's pids")
    process.send_signal(signal.SIGKILL)
    process.communicate()
    _ended_else_killed(pids)


def test_a_sigterm_ends_the_batch_with_its_commands(tmp_path: Path) -> None:
    # SIGTERM (`timeout`, systemd, a CI runner's cancel) kills the batch with Python's
    # default action: no cancelled envelopes, no summary, and the commands run on.
    pids, args = _command_batch(tmp_path)
    process = start(*args, cwd=tmp_path)
    wait_until(lambda: _started(pids), "the command's pids")
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=30)
    _ended_else_killed(pids)


def test_resume_without_a_journal_for_the_results_reruns_nothing_the_file_holds(
    tmp_path: Path,
) -> None:
    write_jsonl(tmp_path / "items.jsonl", [{"id": "a"}, {"id": "b"}])
    runs = tmp_path / "runs"
    args = (
        "run", "--input", "items.jsonl", "--out", "out.jsonl", "--id-field", "id",
        "--agent", AGENT, "--progress", "none",
    )  # fmt: skip
    first = batch(*args, cwd=tmp_path, runs=runs)
    assert first.returncode == 0, first.stderr
    kept = (tmp_path / "out.jsonl").read_bytes()
    # The store is elsewhere now (a --store forgotten, a cleaned .subagents, a results
    # file reached through a symlink): --resume finds no journal of this batch, empties
    # the results file and runs every item again, without a word.
    resumed = batch(*args, "--resume", "--store", "elsewhere.db", cwd=tmp_path, runs=runs)
    assert runs_of(runs) == ["a", "b"], "finished items ran again: " + resumed.stderr
    assert (tmp_path / "out.jsonl").read_bytes().startswith(kept), "the results were discarded"


def test_an_unbalanced_quote_in_command_is_a_usage_error_not_a_traceback(
    tmp_path: Path,
) -> None:
    write_jsonl(tmp_path / "items.jsonl", [{"id": "a"}])
    done = batch(
        "run", "--input", "items.jsonl", "--out", "out.jsonl", "--command", "echo 'oops",
        "--progress", "none", cwd=tmp_path,
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2
    assert "--command" in done.stderr


def test_a_csv_cell_over_128_kib_is_no_traceback(tmp_path: Path) -> None:
    (tmp_path / "items.csv").write_text("id,text\na," + "x" * 200_000 + "\nb,short\n")
    done = batch(
        "run", "--input", "items.csv", "--out", "out.jsonl", "--id-field", "id",
        "--agent", AGENT, "--progress", "none", cwd=tmp_path,
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    assert "b" in by_id(tmp_path / "out.jsonl"), "the other rows run"


def test_retry_failed_writes_every_id_once_when_a_failure_is_not_the_last_line(
    tmp_path: Path,
) -> None:
    # reconcile's first pass stops at the first line it drops (any() short-circuits), so
    # it reports only the ids before that line as present; _plan then appends the ones
    # after it again, beside the copies the rewrite kept.
    args = (
        "run", "--input", "items.jsonl", "--out", "out.jsonl", "--id-field", "id",
        "--agent", AGENT, "--progress", "none",
    )  # fmt: skip
    write_jsonl(tmp_path / "items.jsonl", [{"id": "bad", "fail": "x"}, {"id": "ok"}])
    first = batch(*args, "-j", "1", cwd=tmp_path)
    assert first.returncode == 1, first.stderr
    write_jsonl(tmp_path / "items.jsonl", [{"id": "bad"}, {"id": "ok"}])
    retried = batch(*args, "--retry-failed", cwd=tmp_path)
    assert retried.returncode == 0, retried.stderr
    assert sorted(by_id(tmp_path / "out.jsonl")) == ["bad", "ok"]  # by_id: no id twice


def test_an_error_names_the_batch_command_not_the_value_of_its_command_option(
    tmp_path: Path,
) -> None:
    # batch run's --command has the dest of the top-level subcommand ("command"), so
    # main()'s OSError net prints "subagents true: ..." (or "subagents None: ..." with
    # --agent) for a missing --input.
    for runner in (("--command", "true"), ("--agent", AGENT)):
        done = batch(
            "run", "--input", "missing.jsonl", "--out", "out.jsonl", *runner,
            "--progress", "none", cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode in (1, 2)
        assert done.stderr.startswith("subagents batch"), done.stderr


def test_an_agents_own_timeout_holds_when_timeout_is_not_given(tmp_path: Path) -> None:
    # --timeout defaults to 1800 and is passed to every spawn, which overrides the spec's
    # own timeout (the library's order: the spawn's, the agent's, the config's); --retries
    # left out keeps the spec's retry policy, --timeout left out should keep its timeout.
    write_jsonl(tmp_path / "items.jsonl", [{"id": "slow", "sleep": 3}])
    done = batch(
        "run", "--input", "items.jsonl", "--out", "out.jsonl", "--id-field", "id",
        "--agent", "tests.batch.test_review_batch_cli:SHORT", "--progress", "none",
        cwd=tmp_path,
    )  # fmt: skip
    assert by_id(tmp_path / "out.jsonl")["slow"]["status"] == "timeout", done.stderr
