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

from subagents import (
    AgentSpec,
    DelegateResult,
    Request,
    RunContext,
    SubagentConfig,
    SubagentManager,
)
from subagents import _cli_batch_run as batch_run
from subagents._cli_batch_inputs import Item
from subagents._cli_batch_journal import BatchJournal
from subagents._cli_batch_progress import Counters
from subagents._cli_batch_results import ResultsFile, reconcile
from subagents._cli_batch_status import _alive
from subagents._cli_batch_summary import Tally
from subagents._processes import process_start
from subagents.store import SqliteStore, StoreError
from tests.batch.agents import NOOP
from tests.batch.support import batch, write_jsonl

pytestmark = pytest.mark.anyio


def _settings(
    tmp_path: Path, spec: AgentSpec, *, jobs: int, keep_order: bool
) -> batch_run.Settings:
    """A fresh run's command line: ``r.jsonl`` and ``b.db`` in ``tmp_path``, no halt."""
    return batch_run.Settings(
        out=str(tmp_path / "r.jsonl"), store=str(tmp_path / "b.db"), specs=[spec],
        template=None, jobs=jobs, timeout=None, resume="fresh", halt=None,
        keep_order=keep_order, progress="none", events=None, grace=0.0,
    )  # fmt: skip


def _run(
    settings: batch_run.Settings,
    manager: SubagentManager,
    journal: object,
    results: ResultsFile,
    items: list[Item],
    failures: list[Exception],
) -> batch_run._Run:
    """The state a run's tasks share, for ``items`` (the journal may be a stand-in)."""
    return batch_run._Run(
        settings=settings, manager=manager, journal=journal,  # type: ignore[arg-type]
        results=results, tally=Tally(total=len(items)), counters=Counters(len(items)),
        total=len(items), failures=failures,
    )  # fmt: skip


def _envelope(item_id: str) -> DelegateResult:
    return DelegateResult(agent="a", task_id=item_id, status="completed", output=item_id)


class _Watched(ResultsFile):
    """A results file that tells when two lines are held back."""

    def __init__(self, path: str, *, order: list[str], on_error: object) -> None:
        super().__init__(path, order=order, on_error=on_error)  # type: ignore[arg-type]
        self.two_held = anyio.Event()

    def write(self, item_id: str, envelope: DelegateResult) -> None:
        super().write(item_id, envelope)
        if self.held >= 2:
            self.two_held.set()


async def test_keep_order_admission_waits_while_the_held_lines_reach_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first item is slow: every later line is held behind it (--keep-order). The
    # runners stop admitting once the held lines reach the bound, and go on once it ends.
    monkeypatch.setattr(batch_run, "_BACKLOG", 2)
    first_may_end = anyio.Event()
    spawned: list[str] = []

    async def slow_first(request: Request, ctx: RunContext) -> str:
        spawned.append(request.input)
        if request.input == '{"id":"1"}':
            await first_may_end.wait()
        return request.input

    spec = AgentSpec(name="slow-first", runner=slow_first)
    items = [Item(id=str(n), line=n, fields={"id": str(n)}) for n in range(1, 21)]
    settings = _settings(tmp_path, spec, jobs=3, keep_order=True)
    failures: list[Exception] = []
    results = _Watched(settings.out, order=[i.id for i in items], on_error=failures.append)
    config = SubagentConfig(retain_collected=0)
    async with SqliteStore(settings.store) as store, SubagentManager([spec], config=config) as m:
        journal = BatchJournal(store, "b", fresh=True)
        run = _run(settings, m, journal, results, items, failures)
        async with anyio.create_task_group() as tg:
            tg.start_soon(batch_run._admit, run, items)
            with anyio.fail_after(5):
                await results.two_held.wait()  # the lines behind the first, committed
            await anyio.wait_all_tasks_blocked()
            assert len(spawned) < len(items), "admission goes on past the bound"
            first_may_end.set()
    results.close()
    lines = (tmp_path / "r.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == [i.id for i in items]
    assert failures == []


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


class _CommitFailsOnceFull:
    """A journal whose first commit fails (StoreError) once the runner waits for room:
    the backlog is full of envelopes that will never be committed."""

    def __init__(self) -> None:
        self.recorded: list[str] = []

    def record(self, item_id: str, envelope: DelegateResult) -> None:
        self.recorded.append(item_id)

    async def wait_committed(self) -> None:
        await anyio.wait_all_tasks_blocked()
        raise StoreError("batch.db", "failed", "disk I/O error")

    def write_manifest(self, **fields: object) -> None:
        pass


async def test_admission_ends_when_a_commit_fails_while_the_backlog_is_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The runner waits for room while the backlog is full; the commit those lines wait
    # for fails, so the backlog never shrinks: the wait must still end, nothing more be
    # admitted, and the batch stop with exit status 1. The backlog is 2 here, not 4096.
    monkeypatch.setattr(batch_run, "_BACKLOG", 2)
    items = [Item(id=str(n), line=n, fields={"id": str(n)}) for n in range(1, 7)]
    settings = _settings(tmp_path, NOOP, jobs=1, keep_order=True)
    failures: list[Exception] = []
    results = ResultsFile(settings.out, order=[i.id for i in items], on_error=failures.append)
    journal = _CommitFailsOnceFull()
    async with SubagentManager([NOOP], config=SubagentConfig(retain_collected=0)) as manager:
        run = _run(settings, manager, journal, results, items, failures)
        with anyio.fail_after(1.5):
            await batch_run._admit(run, items)
    results.close()
    assert journal.recorded == ["1", "2"], "admitted past the full backlog"
    assert run.stopped == "stopped: the store failed"


class _RecordFailsAt:
    """A journal whose ``record`` fails (StoreError) from the ``fail_at``-th envelope on;
    what it did record commits."""

    def __init__(self, fail_at: int) -> None:
        self.fail_at = fail_at
        self.recorded: list[str] = []

    def record(self, item_id: str, envelope: DelegateResult) -> None:
        if len(self.recorded) + 1 >= self.fail_at:
            raise StoreError("batch.db", "failed", "disk I/O error")
        self.recorded.append(item_id)

    async def wait_committed(self) -> None:
        pass

    def write_manifest(self, **fields: object) -> None:
        pass


@pytest.mark.parametrize("commit_fails", [False, True], ids=["record-fails", "commit-fails"])
async def test_the_tally_counts_only_the_envelopes_the_results_file_holds_when_the_store_fails(
    tmp_path: Path, commit_fails: bool
) -> None:
    # The summary's tally is "what the results file holds, and what this run did": an
    # envelope the store never took (its put failed) or never committed (its line is
    # never written) is in neither the store nor the file, and --resume runs it again.
    items = [Item(id=str(n), line=n, fields={"id": str(n)}) for n in range(1, 5)]
    settings = _settings(tmp_path, NOOP, jobs=1, keep_order=False)
    failures: list[Exception] = []
    results = ResultsFile(settings.out, order=None, on_error=failures.append)
    journal: object = _CommitFailsOnceFull() if commit_fails else _RecordFailsAt(3)
    async with SubagentManager([NOOP], config=SubagentConfig(retain_collected=0)) as manager:
        run = _run(settings, manager, journal, results, items, failures)
        with anyio.fail_after(5):
            await batch_run._admit(run, items)
    results.close()
    assert run.stopped == "stopped: the store failed"
    lines = (tmp_path / "r.jsonl").read_text().splitlines()
    assert run.tally.done == len(lines), "the summary counts envelopes the file lacks"
    assert run.counters.done == len(lines), "the progress counts envelopes the file lacks"
