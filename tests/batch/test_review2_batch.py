"""Second review of ``subagents batch run``: the fixes after the first review (template
braces, CSV line numbering and the unterminated-quote check) and JSON numbers in items."""

from __future__ import annotations

import json
import os
from pathlib import Path

import anyio
import pytest

from subagents import DelegateResult, SubagentConfig, SubagentManager
from subagents import _cli_batch_run as batch_run
from subagents._cli_batch_inputs import Item, read_items
from subagents._cli_batch_progress import Counters
from subagents._cli_batch_results import ResultsFile
from subagents._cli_batch_summary import Tally
from subagents.backends.command import fill_template
from subagents.store import StoreError

from .agents import NOOP
from .support import batch, write_jsonl


def _read(path: Path, id_field: str | None = None) -> list[tuple[str, int, dict[str, object]]]:
    found = read_items(str(path), id_field=id_field, fmt=None, rename_duplicates=False)
    assert found.malformed == []
    return [(i.id, i.line, i.fields) for i in found.items]


def test_nested_closing_braces_of_a_template_that_holds_no_field_stay_as_written() -> None:
    # Single braces around anything but a name are kept (``awk '{print $1}'``), so a jq
    # filter or a JSON literal reads as written; but two adjacent closing braces are
    # collapsed into one, which silently turns valid jq or JSON into a syntax error.
    assert fill_template("{a: {b: .x}}", {}) == "{a: {b: .x}}"
    assert fill_template('{"a":{"b":1}}', {}) == '{"a":{"b":1}}'


def test_a_csv_with_cr_line_endings_is_read_not_raised(tmp_path: Path) -> None:
    # Classic Mac line endings (Excel's "CSV (Macintosh)"): the csv module reads them,
    # but the unterminated-quote check counts only "\n" and raises ValueError.
    path = tmp_path / "items.csv"
    path.write_bytes(b"id,v\r1,a\r2,b\r")
    assert [(i, f) for i, _, f in _read(path, "id")] == [
        ("1", {"id": "1", "v": "a"}),
        ("2", {"id": "2", "v": "b"}),
    ]


def test_a_quoted_cr_in_a_csv_cell_shifts_no_later_line_number(tmp_path: Path) -> None:
    # A bare "\r" inside a quoted cell is no line end for an editor (nor for the JSONL
    # reader, which ends lines at "\n" only), but reader.line_num counts it as one: every
    # later record is numbered one too high, so its default id changes.
    path = tmp_path / "items.csv"
    path.write_bytes(b'id,v\n1,"a\rb"\n2,c\n')
    assert [(i, line) for i, line, _ in _read(path)] == [("2", 2), ("3", 3)]


def test_a_jsonl_integer_beyond_64_bits_is_kept_exact(tmp_path: Path) -> None:
    # orjson reads an integer over 64 bits as a float: 18446744073709551616 becomes
    # 1.8446744073709552e+19, filled into {n} and sent on stdin so; as an --id-field it
    # is then no usable id at all.
    path = tmp_path / "items.jsonl"
    path.write_text('{"id": 18446744073709551616, "n": 123456789012345678901234567890}\n')
    [(item_id, _, fields)] = _read(path, "id")
    assert item_id == "18446744073709551616"
    assert fields["n"] == 123456789012345678901234567890


def test_batch_status_names_the_results_file_when_the_store_folder_is_a_symlink(
    tmp_path: Path,
) -> None:
    # The journal names a batch from the store's real folder (realpath), but status joins
    # that name to the folder as given (abspath): with .subagents a link to another disk,
    # status names "proj/r.jsonl", a file that does not exist from here.
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


@pytest.mark.anyio
async def test_keep_order_admission_ends_when_the_awaited_items_commit_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Admission waits for the held-lines backlog to shrink (wait_held_below) before it
    # looks at run.stop. When the item every held line waits on fails its commit, its line
    # is never written nor skipped, the backlog never shrinks, and the batch hangs instead
    # of stopping with exit status 1. The backlog is 2 here instead of 4096.
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


def test_json_writes_an_integer_beyond_64_bits_exactly_and_refuses_what_it_refused() -> None:
    """The fallback to the stdlib is for orjson's refused integers only: a value orjson
    refuses for another reason (a key that is not text) is still refused."""
    from subagents._json import dumps, dumps_str

    assert dumps_str({"n": [2**70, -(2**63), 2**64 - 1]}) == (
        '{"n":[1180591620717411303424,-9223372036854775808,18446744073709551615]}'
    )
    assert dumps(-(2**63) - 1) == b"-9223372036854775809"
    with pytest.raises(TypeError):
        dumps_str({1: 2})
    with pytest.raises(TypeError):  # a lone surrogate beside a big integer: still refused
        dumps_str([2**70, "\ud800"])
    with pytest.raises(TypeError):
        dumps_str({1: 2**70})
