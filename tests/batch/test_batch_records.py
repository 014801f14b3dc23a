"""The batch's own records: the results file's ``--keep-order`` bound (and admission
ending when the item it waits on fails its commit), the results file reconciled on
resume, and ``batch status`` telling a live batch from a reused pid and naming the
results file when the store's folder is a symlink."""

from __future__ import annotations

import json
import os
from pathlib import Path

import anyio
import pytest

from subagents import DelegateResult, SubagentConfig, SubagentManager
from subagents import _cli_batch_run as batch_run
from subagents._cli_batch_inputs import Item
from subagents._cli_batch_progress import Counters
from subagents._cli_batch_results import ResultsFile, reconcile
from subagents._cli_batch_status import _alive
from subagents._cli_batch_summary import Tally
from subagents._processes import process_start
from subagents.store import StoreError
from tests.batch.agents import NOOP
from tests.batch.support import batch, write_jsonl

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


def test_reconcile_reports_every_kept_id_when_an_early_line_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_bytes(b'{"id": "bad", "envelope": {}}\n{"id": "ok", "envelope": {}}\n')
    assert reconcile(str(path), {"ok"}) == {"ok"}
    assert path.read_bytes() == b'{"id": "ok", "envelope": {}}\n'


def test_batch_status_names_the_results_file_when_the_store_folder_is_a_symlink(
    tmp_path: Path,
) -> None:
    # The journal names a batch from the store's real folder (realpath); status joining
    # that name to the folder as given (abspath) would name "proj/r.jsonl" with
    # .subagents a link to another disk, a file that does not exist from here.
    project = tmp_path / "proj"
    project.mkdir()
    (tmp_path / "disk").mkdir()
    os.symlink("../disk", project / ".subagents")
    write_jsonl(project / "in.jsonl", [{"id": "a"}])
    ran = batch(
        "run", "--input", "in.jsonl", "--out", "r.jsonl", "--command", "true",
        "--progress", "none", cwd=project,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    status = batch("status", "--store", ".subagents/batch.db", "--json", cwd=project)
    assert status.returncode == 0, status.stderr
    [report] = [json.loads(line) for line in status.stdout.splitlines()]
    assert report["out"] == "r.jsonl"


class _Watched(ResultsFile):
    """A results file that tells when two lines are held back."""

    def __init__(self, path: str, *, order: list[str], on_error: object) -> None:
        super().__init__(path, order=order, on_error=on_error)  # type: ignore[arg-type]
        self.two_held = anyio.Event()

    def write(self, item_id: str, envelope: DelegateResult) -> None:
        super().write(item_id, envelope)
        if self.held >= 2:
            self.two_held.set()


class _FirstCommitFails:
    """A journal whose first item's commit fails (StoreError) once two later items' lines
    are held behind it (--keep-order)."""

    def __init__(self, results: _Watched) -> None:
        self.results = results
        self.first: object = None
        self.recorded: dict[object, str] = {}

    def record(self, item_id: str, envelope: DelegateResult) -> None:
        task = anyio.get_current_task().id
        self.recorded[task] = item_id
        if self.first is None:
            self.first = task

    async def wait_committed(self) -> None:
        if anyio.get_current_task().id != self.first:
            return
        await self.results.two_held.wait()
        raise StoreError("batch.db", "failed", "disk I/O error")

    def write_manifest(self, **fields: object) -> None:
        pass


async def test_keep_order_admission_ends_when_the_awaited_items_commit_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Admission waits for the held-lines backlog to shrink (wait_held_below) before it
    # looks at run.stop. When the item every held line waits on fails its commit, its line
    # is never written nor skipped and the backlog never shrinks: the wait must still end,
    # and the batch stop with exit status 1. The backlog is 2 here instead of 4096.
    monkeypatch.setattr(batch_run, "_BACKLOG", 2)
    items = [Item(id=str(n), line=n, fields={"id": str(n)}) for n in range(1, 7)]
    settings = batch_run.Settings(
        out=str(tmp_path / "r.jsonl"), store=str(tmp_path / "b.db"), specs=[NOOP],
        template=None, jobs=1, timeout=None, resume="fresh", halt=None, keep_order=True,
        progress="none", events=None, grace=0.0,
    )  # fmt: skip
    failures: list[Exception] = []
    results = _Watched(settings.out, order=[i.id for i in items], on_error=failures.append)
    journal = _FirstCommitFails(results)
    async with SubagentManager([NOOP], config=SubagentConfig(retain_collected=0)) as manager:
        run = batch_run._Run(
            settings=settings, manager=manager, journal=journal,  # type: ignore[arg-type]
            results=results, tally=Tally(total=len(items)), counters=Counters(len(items)),
            total=len(items), failures=failures,
        )  # fmt: skip
        with anyio.fail_after(1.5):
            await batch_run._admit(run, items)
    results.close()
    assert run.stopped == "stopped: the store failed"
