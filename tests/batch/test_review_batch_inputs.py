"""Review of ``subagents batch run``: edge cases of JSONL and CSV inputs, and of the
results file made to agree with the store on resume."""

from __future__ import annotations

from pathlib import Path

from subagents._cli_batch_inputs import read_items
from subagents._cli_batch_results import reconcile


def _read(path: Path, id_field: str | None = "id") -> tuple[list[tuple[str, int]], list[int]]:
    found = read_items(str(path), id_field=id_field, fmt=None, rename_duplicates=False)
    return [(i.id, i.line) for i in found.items], [line for line, _ in found.malformed]


def test_a_jsonl_string_holding_u2028_or_nel_is_one_item_on_its_own_line(
    tmp_path: Path,
) -> None:
    # JSON allows U+2028, U+2029 and U+0085 unescaped inside a string (json.dumps with
    # ensure_ascii=False writes them so); only "\n" (and "\r") end a JSONL line.
    path = tmp_path / "items.jsonl"
    path.write_text(
        '{"id": "a", "text": "x\u2028y"}\n{"id": "b", "text": "x\x85y"}\n{"id": "c"}\n',
        encoding="utf-8",
    )
    assert _read(path) == ([("a", 1), ("b", 2), ("c", 3)], [])


def test_a_csv_cell_over_128_kib_is_read_not_raised_as_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "items.csv"
    path.write_text("id,text\na," + "x" * 200_000 + "\nb,short\n")
    items, malformed = _read(path)  # csv.Error: field larger than field limit (131072)
    assert ("b", 3) in items
    assert [i for i, _ in items] == ["a", "b"] or malformed == [2]


def test_a_line_that_is_not_utf8_is_malformed_with_its_number_and_the_others_run(
    tmp_path: Path,
) -> None:
    path = tmp_path / "items.jsonl"
    path.write_bytes(b'{"id": "a"}\n{"id": "caf\xe9"}\n{"id": "c"}\n')
    # Today the whole input is refused: "not UTF-8 (byte 21)", no line, nothing runs.
    assert _read(path) == ([("a", 1), ("c", 3)], [2])


def test_blank_lines_before_a_csv_header_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "items.csv"
    path.write_text("\nid,text\na,1\nb,2\n")
    # Today the blank line is the header (no columns): every row is "2 fields where the
    # header has 0".
    assert _read(path) == ([("a", 3), ("b", 4)], [])


def test_a_multiline_csv_record_is_numbered_by_the_line_it_starts_on(tmp_path: Path) -> None:
    path = tmp_path / "items.csv"
    path.write_text('text,n\n"two\nlines",1\nplain,2\n')
    # An editor shows the first record on line 2; csv's line_num is the line it ends on.
    assert _read(path, id_field=None) == ([("2", 2), ("4", 4)], [])


def test_reconcile_reports_every_kept_id_when_an_early_line_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_bytes(b'{"id": "bad", "envelope": {}}\n{"id": "ok", "envelope": {}}\n')
    assert reconcile(str(path), {"ok"}) == {"ok"}
    assert path.read_bytes() == b'{"id": "ok", "envelope": {}}\n'
