"""``subagents batch run``: both runners, timeouts, retries, order, events, exit statuses."""

from __future__ import annotations

import json
from pathlib import Path

from tests.batch.support import batch, by_id, results, write_jsonl

AGENT = "tests.batch.agents:ECHO"


def test_a_command_gets_the_item_on_stdin_and_its_stdout_is_the_output(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "items.jsonl", [{"id": "a", "word": "two words"}])
    done = batch(
        "run", "--input", "items.jsonl", "--out", "out.jsonl", "--id-field", "id",
        "--progress", "none", "--command", "sh -c 'printf \"[%s] \" \"$1\"; cat' sh {word}",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    output = by_id(tmp_path / "out.jsonl")["a"]["output"]
    assert isinstance(output, str)
    prefix, _, stdin = output.partition("] ")
    assert prefix == "[two words", "a field is one argument, never split by a shell"
    assert json.loads(stdin) == {"id": "a", "word": "two words"}


def test_a_non_zero_exit_is_an_error_envelope_with_the_code_and_the_stderr_tail(
    tmp_path: Path,
) -> None:
    write_jsonl(tmp_path / "items.jsonl", [{"id": "ok", "code": 0}, {"id": "bad", "code": 3}])
    done = batch(
        "run", "--input", "items.jsonl", "--out", "out.jsonl", "--id-field", "id",
        "--progress", "none", "--command", "sh -c 'echo out; echo oops >&2; exit $1' sh {code}",
        cwd=tmp_path,
    )  # fmt: skip
    found = by_id(tmp_path / "out.jsonl")
    assert found["ok"]["status"] == "completed"
    assert found["bad"]["status"] == "error"
    assert found["bad"]["error_type"] == "subagents.backends.command.CommandFailed"
    error = found["bad"]["error"]
    assert isinstance(error, str)
    assert "exit code 3" in error
    assert "stderr: oops" in error
    assert done.returncode == 1, "the exit status is the number of failed items"
    assert "failed bad: CommandFailed" in done.stderr
    shown = batch("status", "--store", ".subagents/batch.db", "--json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    (report,) = [json.loads(line) for line in shown.stdout.splitlines()]
    assert report["state"] == "finished"
    assert (report["total"], report["done"]) == (2, 2)
    assert report["by_status"] == {"completed": 1, "error": 1}
    assert [item_id for item_id, _ in report["failures"]] == ["bad"]


def test_agents_from_a_list_are_picked_by_the_agent_field_and_get_the_template(
    tmp_path: Path,
) -> None:
    write_jsonl(
        tmp_path / "items.jsonl",
        [{"id": "a", "agent": "shout", "who": "ada"}, {"id": "b", "agent": "nobody"}],
    )
    done = batch(
        "run", "--input", "items.jsonl", "--out", "out.jsonl", "--id-field", "id",
        "--progress", "none", "--agent", "tests.batch.agents:TWO",
        "--template", "hello {who}", cwd=tmp_path,
    )  # fmt: skip
    found = by_id(tmp_path / "out.jsonl")
    assert found["a"]["output"] == "HELLO ADA"
    assert found["b"]["status"] == "error"
    assert "'who'" in str(found["b"]["error"]), "the missing field is named"
    assert done.returncode == 1


def test_the_timeout_ends_a_command_in_a_timeout_envelope(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "items.jsonl", [{"id": "slow", "sleep": 60}, {"id": "fast", "sleep": 0}])
    done = batch(
        "run", "--input", "items.jsonl", "--out", "out.jsonl", "--id-field", "id",
        "--progress", "none", "--command", "sleep {sleep}", "--timeout", "1", cwd=tmp_path,
    )  # fmt: skip
    found = by_id(tmp_path / "out.jsonl")
    assert (found["slow"]["status"], found["fast"]["status"]) == ("timeout", "completed")
    assert found["slow"]["error"] == "watchdog: no result within 1 s"
    assert done.returncode == 1


def test_retries_run_a_failed_command_again(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "items.jsonl", [{"id": "a", "flag": str(tmp_path / "flag")}])
    # Fails the first time (and leaves the flag), succeeds the second.
    script = 'sh -c \'if [ -e "$1" ]; then echo second; else touch "$1"; exit 1; fi\' sh {flag}'
    done = batch(
        "run", "--input", "items.jsonl", "--out", "out.jsonl", "--id-field", "id",
        "--progress", "none", "--command", script, "--retries", "1", cwd=tmp_path,
    )  # fmt: skip
    envelope = by_id(tmp_path / "out.jsonl")["a"]
    assert done.returncode == 0, done.stderr
    assert (envelope["status"], envelope["output"], envelope["attempts"]) == (
        "completed",
        "second\n",
        2,
    )


def test_keep_order_writes_in_input_order_whatever_finishes_first(tmp_path: Path) -> None:
    items = [{"id": f"i{n}", "sleep": 0.05 * (6 - n)} for n in range(6)]
    write_jsonl(tmp_path / "items.jsonl", items)
    done = batch(
        "run", "--input", "items.jsonl", "--out", "out.jsonl", "--id-field", "id",
        "--progress", "none", "--agent", AGENT, "-j", "6", "--keep-order", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert [line["id"] for line in results(tmp_path / "out.jsonl")] == [i["id"] for i in items]


def test_more_than_100_failures_exit_101_and_events_are_logged(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "items.jsonl", [{"n": n} for n in range(101)])
    done = batch(
        "run", "--input", "items.jsonl", "--out", "out.jsonl", "--progress", "none",
        "--command", "false", "--events", "events.jsonl", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 101
    assert len(by_id(tmp_path / "out.jsonl")) == 101
    kinds = [
        json.loads(line)["type"] for line in (tmp_path / "events.jsonl").read_text().splitlines()
    ]
    assert kinds.count("subagent.completed") == 101


def test_a_bad_agent_reference_is_a_usage_error(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "items.jsonl", [{"id": "a"}])
    done = batch(
        "run", "--input", "items.jsonl", "--out", "out.jsonl",
        "--agent", "tests.batch.agents:MISSING", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2
    assert "'MISSING' not found" in done.stderr


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


def test_an_error_names_the_batch_command_not_the_value_of_its_command_option(
    tmp_path: Path,
) -> None:
    # batch run's --command shares its name with the dest of the top-level subcommand
    # ("command"): main()'s OSError net must not print "subagents true: ..." (or
    # "subagents None: ..." with --agent) for a missing --input.
    for runner in (("--command", "true"), ("--agent", AGENT)):
        done = batch(
            "run", "--input", "missing.jsonl", "--out", "out.jsonl", *runner,
            "--progress", "none", cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode in (1, 2)
        assert done.stderr.startswith("subagents batch"), done.stderr


def test_an_agents_own_timeout_holds_when_timeout_is_not_given(tmp_path: Path) -> None:
    # A spawn's timeout overrides the spec's own (the library's order: the spawn's, the
    # agent's, the config's), so --timeout left out must pass none; as --retries left out
    # keeps the spec's retry policy, --timeout left out keeps its timeout.
    write_jsonl(tmp_path / "items.jsonl", [{"id": "slow", "sleep": 3}])
    done = batch(
        "run", "--input", "items.jsonl", "--out", "out.jsonl", "--id-field", "id",
        "--agent", "tests.batch.agents:SHORT", "--progress", "none",
        cwd=tmp_path,
    )  # fmt: skip
    assert by_id(tmp_path / "out.jsonl")["slow"]["status"] == "timeout", done.stderr
