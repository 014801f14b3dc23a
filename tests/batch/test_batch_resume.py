"""``subagents batch run --resume | --retry-failed``: after a SIGKILL at random points, every
id is in the results file exactly once and nothing that had finished runs again."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.batch.support import (
    batch,
    by_id,
    environment,
    lines_of,
    results,
    runs_of,
    start,
    wait_until,
    write_jsonl,
)

AGENT = "tests.batch.agents:ECHO"
KILLS = int(os.environ.get("SUBAGENTS_BATCH_KILLS", "10"))


def _run(*extra: str) -> tuple[str, ...]:
    return (
        "run", "--input", "items.jsonl", "--out", "out.jsonl", "--id-field", "id",
        "--agent", AGENT, "-j", "8", "--progress", "none", *extra,
    )  # fmt: skip


def test_sigkill_at_random_points_then_resume_loses_nothing_and_reruns_nothing_finished(
    tmp_path: Path,
) -> None:
    # Room for every kill even when a loaded machine lets each run well past its target
    # before the kill lands (a CI run saw 26 lines a kill where 9 were aimed at).
    total = 600
    write_jsonl(tmp_path / "items.jsonl", [{"id": f"t{n}", "sleep": 0.01} for n in range(total)])
    out, runs = tmp_path / "out.jsonl", tmp_path / "runs"
    seed = random.randrange(2**32)
    chance = random.Random(seed)
    # (ids in the file at a kill, runs recorded by then): those ids must never run again.
    checkpoints: list[tuple[set[str], int]] = []
    while len(checkpoints) < KILLS:
        target = lines_of(out) + chance.randrange(0, 18)
        process = start(*_run("--resume"), cwd=tmp_path, runs=runs)
        # Killed once the file reaches a random length (at 0 more lines: as soon as it
        # has started, before it reconciled or ran anything), unless it finishes first.
        wait_until(lambda t=target, p=process: lines_of(out) >= t or p.poll() is not None, "a line")
        if process.poll() is not None:
            process.communicate()
            break
        process.send_signal(signal.SIGKILL)
        process.communicate()
        finished = set(by_id(out)) if out.exists() else set()  # parses after every kill
        checkpoints.append((finished, len(runs_of(runs))))
    done = batch(*_run("--resume"), cwd=tmp_path, runs=runs)
    assert done.returncode == 0, f"seed {seed}: {done.stderr}"
    found = by_id(out)  # parses, and no id twice
    assert set(found) == {f"t{n}" for n in range(total)}, f"seed {seed}"
    assert {e["status"] for e in found.values()} == {"completed"}
    ran = runs_of(runs)
    for finished, ran_before in checkpoints:
        again = finished & set(ran[ran_before:])
        assert not again, f"seed {seed}: {sorted(again)} ran again after they had finished"
    assert len(checkpoints) == KILLS, f"seed {seed}: the batch outran the kills"


def test_resume_writes_the_lines_a_kill_kept_from_the_file_and_drops_a_torn_one(
    tmp_path: Path,
) -> None:
    write_jsonl(tmp_path / "items.jsonl", [{"id": f"t{n}"} for n in range(6)])
    runs = tmp_path / "runs"
    first = batch(*_run(), cwd=tmp_path, runs=runs)
    assert first.returncode == 0, first.stderr
    out = tmp_path / "out.jsonl"
    lines = out.read_bytes().splitlines(keepends=True)
    # A kill between the store's commit and the write: the last two lines never made it,
    # and the last write was torn.
    out.write_bytes(b"".join(lines[:4]) + lines[4][:20])
    done = batch(*_run("--resume"), cwd=tmp_path, runs=runs)
    assert done.returncode == 0, done.stderr
    assert set(by_id(out)) == {f"t{n}" for n in range(6)}
    assert len(runs_of(runs)) == 6, "nothing ran again: the envelopes were in the store"
    assert "6/6 done (6 completed); 0 run" in done.stderr


def test_retry_failed_reruns_error_timeout_and_cancelled_and_keeps_the_rest(
    tmp_path: Path,
) -> None:
    items: list[dict[str, object]] = [
        {"id": "ok"}, {"id": "bad", "fail": "x"}, {"id": "slow", "sleep": 60},
    ]  # fmt: skip
    write_jsonl(tmp_path / "items.jsonl", items)
    runs = tmp_path / "runs"
    first = batch(*_run("--timeout", "0.3"), cwd=tmp_path, runs=runs)
    assert first.returncode == 2
    resumed = batch(*_run("--resume"), cwd=tmp_path, runs=runs)
    assert resumed.returncode == 2, "--resume runs nothing that has an envelope"
    assert len(runs_of(runs)) == 3
    write_jsonl(tmp_path / "items.jsonl", [{"id": "ok"}, {"id": "bad"}, {"id": "slow"}])
    retried = batch(*_run("--retry-failed"), cwd=tmp_path, runs=runs)
    assert retried.returncode == 0, retried.stderr
    assert sorted(runs_of(runs)[3:]) == ["bad", "slow"]
    assert [line["id"] for line in results(tmp_path / "out.jsonl")] == ["ok", "bad", "slow"]
    assert {e["status"] for e in by_id(tmp_path / "out.jsonl").values()} == {"completed"}


def test_a_fresh_run_refuses_a_results_file_that_holds_results(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "items.jsonl", [{"id": "a"}])
    (tmp_path / "out.jsonl").write_text('{"id": "a", "envelope": {}}\n')
    done = batch(*_run(), cwd=tmp_path)
    assert done.returncode == 2
    assert "--resume" in done.stderr


_SIGNAL_AT_FSYNC = """
import os, signal, sys
from subagents._cli import main
fsync = os.fsync
def fsync_signalled(fd):  # the rewrite's fsync: between its temporary file and the rename
    os.fsync = fsync
    os.kill(os.getpid(), signal.{name})
    fsync(fd)
os.fsync = fsync_signalled
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_a_signal_during_the_retry_failed_rewrite_leaves_no_temporary_file(
    tmp_path: Path, name: str
) -> None:
    write_jsonl(tmp_path / "items.jsonl", [{"id": "ok"}, {"id": "bad", "fail": "x"}])
    first = batch(*_run(), cwd=tmp_path)
    assert first.returncode == 1, first.stderr
    script = _SIGNAL_AT_FSYNC.format(name=name)
    retried = subprocess.run(
        [sys.executable, "-c", script, "batch", *_run("--retry-failed")],
        cwd=tmp_path, env=environment(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    # The signal acts once the rename is done: the run stops before anything runs again.
    assert retried.returncode != 0, retried.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("out.")) == ["out.jsonl"]
    assert [line["id"] for line in results(tmp_path / "out.jsonl")] == ["ok"]


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
    # file reached through a symlink): --resume finds no journal of this batch, and must
    # neither empty the results file nor run every item again without a word.
    resumed = batch(*args, "--resume", "--store", "elsewhere.db", cwd=tmp_path, runs=runs)
    assert runs_of(runs) == ["a", "b"], "finished items ran again: " + resumed.stderr
    assert (tmp_path / "out.jsonl").read_bytes().startswith(kept), "the results were discarded"


def test_retry_failed_writes_every_id_once_when_a_failure_is_not_the_last_line(
    tmp_path: Path,
) -> None:
    # reconcile must report every id the rewrite kept, also those after the first line
    # it drops; one it missed, _plan would append again beside the copy kept.
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
