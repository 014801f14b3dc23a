"""The batch's own records in-process: the results file's ``--keep-order`` bound, and
``batch status`` telling a live batch from a reused pid."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from subagents import DelegateResult
from subagents._cli_batch_results import ResultsFile
from subagents._cli_batch_status import _alive
from subagents._processes import process_start

pytestmark = pytest.mark.anyio


def _envelope(item_id: str) -> DelegateResult:
    return DelegateResult(agent="a", task_id=item_id, status="completed", output=item_id)


async def test_keep_order_admission_waits_while_the_held_lines_reach_the_bound(
    tmp_path: Path,
) -> None:
    errors: list[OSError] = []
    results = ResultsFile(str(tmp_path / "out.jsonl"), order=list("abcd"), on_error=errors.append)
    for item_id in "bcd":
        results.write(item_id, _envelope(item_id))  # held: "a" is not written yet
    assert results.held == 3
    admitted = anyio.Event()

    async def admit() -> None:
        await results.wait_held_below(3)
        admitted.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(admit)
        await anyio.wait_all_tasks_blocked()
        assert not admitted.is_set(), "admission goes on past the bound"
        results.write("a", _envelope("a"))
    assert results.held == 0
    results.close()
    assert (tmp_path / "out.jsonl").read_text().count("\n") == 4
    assert errors == []


@pytest.mark.skipif(process_start(os.getpid()) is None, reason="needs /proc")
def test_status_sees_a_pid_that_started_at_another_time_as_another_process() -> None:
    started = process_start(os.getpid())
    assert isinstance(started, int)
    assert _alive(os.getpid(), started)
    assert not _alive(os.getpid(), started + 1), "a reused pid is not the batch"
    assert _alive(os.getpid(), None), "a manifest without a start time: the pid alone"
