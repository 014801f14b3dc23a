"""``subagents batch run --input``: JSONL, CSV and stdin; ids, duplicates, malformed lines,
line ends and line numbers, huge cells and integers beyond 64 bits."""

from __future__ import annotations

from pathlib import Path

import pytest

from subagents._cli_batch_inputs import read_items
from subagents._json import dumps, dumps_str
from tests.batch.support import batch, by_id, write_jsonl

AGENT = "tests.batch.agents:ECHO"


def test_jsonl_items_each_get_one_line_keyed_by_the_id_field(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "items.jsonl", [{"id": f"k{i}"} for i in range(5)])
    done = batch(
        "run", "--input", "items.jsonl", "--out", "out.jsonl", "--agent", AGENT,
        "--id-field", "id", "--progress", "none", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = by_id(tmp_path / "out.jsonl")
    assert set(found) == {f"k{i}" for i in range(5)}
    assert found["k3"]["output"] == "echo k3"
    assert found["k3"]["status"] == "completed"
    assert "5/5 done (5 completed)" in done.stderr
    assert "tokens 15 in, 10 out" in done.stderr
    assert (tmp_path / ".subagents" / "batch.db").exists(), "the default store is beside --out"


def test_csv_rows_are_items_and_their_line_numbers_are_the_default_ids(tmp_path: Path) -> None:
    (tmp_path / "items.csv").write_text('name,count\nalpha,1\n"be, ta",2\n\ngamma,3\n')
    done = batch(
        "run", "--input", "items.csv", "--out", "out.jsonl", "--progress", "none",
        "--command", "printf %s-%s {name} {count}", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = by_id(tmp_path / "out.jsonl")
    # Line numbers as an editor shows them: the header is line 1, the blank line counts.
    assert {k: v["output"] for k, v in found.items()} == {
        "2": "alpha-1",
        "3": "be, ta-2",
        "5": "gamma-3",
    }


def test_stdin_is_read_when_the_input_is_a_dash(tmp_path: Path) -> None:
    done = batch(
        "run", "--input", "-", "--out", "out.jsonl", "--agent", AGENT, "--id-field", "id",
        "--progress", "none", cwd=tmp_path, stdin='{"id": "a"}\n{"id": "b"}\n',
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert set(by_id(tmp_path / "out.jsonl")) == {"a", "b"}


def test_a_duplicate_id_is_a_usage_error_that_lists_its_lines(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "items.jsonl", [{"id": "a"}, {"id": "b"}, {"id": "a"}, {"id": 7}])
    done = batch(
        "run", "--input", "items.jsonl", "--out", "out.jsonl", "--agent", AGENT,
        "--id-field", "id", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2
    assert "duplicate ids: 'a' on lines 1, 3" in done.stderr
    assert not (tmp_path / "out.jsonl").exists(), "nothing ran"


def test_rename_duplicates_numbers_the_repeats_as_codex_does(tmp_path: Path) -> None:
    write_jsonl(
        tmp_path / "items.jsonl",
        [{"id": "a"}, {"id": "a"}, {"id": "a-2"}, {"id": "a"}],
    )
    done = batch(
        "run", "--input", "items.jsonl", "--out", "out.jsonl", "--agent", AGENT,
        "--id-field", "id", "--rename-duplicates", "--progress", "none", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # The second "a" cannot take "a-2": an item has it as its own id.
    assert set(by_id(tmp_path / "out.jsonl")) == {"a", "a-3", "a-2", "a-4"}


def test_a_malformed_line_is_reported_with_its_number_and_the_others_run(
    tmp_path: Path,
) -> None:
    (tmp_path / "items.jsonl").write_text(
        '{"id": "a"}\nnot json\n[1, 2]\n{"id": "b"}\n{"name": "no id"}\n'
    )
    done = batch(
        "run", "--input", "items.jsonl", "--out", "out.jsonl", "--agent", AGENT,
        "--id-field", "id", "--progress", "none", cwd=tmp_path,
    )  # fmt: skip
    assert set(by_id(tmp_path / "out.jsonl")) == {"a", "b"}
    assert "input line 2: not JSON" in done.stderr
    assert "input line 3: a JSON list, not an object" in done.stderr
    assert "input line 5: no usable 'id'" in done.stderr
    assert done.returncode == 3, "each malformed line counts as a failed item"


def test_strict_input_stops_the_run_before_anything_runs(tmp_path: Path) -> None:
    (tmp_path / "items.jsonl").write_text('{"id": "a"}\n{oops\n')
    done = batch(
        "run", "--input", "items.jsonl", "--out", "out.jsonl", "--agent", AGENT,
        "--id-field", "id", "--strict-input", cwd=tmp_path, runs=tmp_path / "runs",
    )  # fmt: skip
    assert done.returncode == 2
    assert "line 2: not JSON" in done.stderr
    assert not (tmp_path / "runs").exists()


def test_an_unterminated_csv_quote_is_a_malformed_record_named_by_its_first_line(
    tmp_path: Path,
) -> None:
    path = tmp_path / "items.csv"
    path.write_text('id,text\na,1\nb,"never closed\nc,3\n')
    found = read_items(str(path), id_field="id", fmt=None, rename_duplicates=False)
    assert [i.id for i in found.items] == ["a"]
    assert [line for line, _ in found.malformed] == [3]
    assert "never closed" in found.malformed[0][1]


def test_an_id_field_or_template_field_that_is_no_csv_column_is_one_usage_error(
    tmp_path: Path,
) -> None:
    (tmp_path / "items.csv").write_text("name,n\na,1\nb,2\n")
    base = ("run", "--input", "items.csv", "--out", "out.jsonl", "--progress", "none")
    by_id_field = batch(*base, "--id-field", "id", "--command", "echo {name}", cwd=tmp_path)
    by_command = batch(*base, "--command", "echo {nmae}", cwd=tmp_path)
    by_template = batch(*base, "--agent", AGENT, "--template", "say {nmae}", cwd=tmp_path)
    for done in (by_id_field, by_command, by_template):
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
        assert "name, n" in done.stderr, "the error lists the header's columns"
    assert "--id-field 'id'" in by_id_field.stderr
    assert "--command: {nmae}" in by_command.stderr
    assert "--template: {nmae}" in by_template.stderr
    assert not (tmp_path / "out.jsonl").exists()


def test_a_missing_input_file_is_a_usage_error(tmp_path: Path) -> None:
    done = batch(
        "run", "--input", "missing.jsonl", "--out", "out.jsonl", "--command", "true",
        "--progress", "none", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--input missing.jsonl" in done.stderr


def test_a_csv_cell_over_128_kib_is_no_traceback(tmp_path: Path) -> None:
    (tmp_path / "items.csv").write_text("id,text\na," + "x" * 200_000 + "\nb,short\n")
    done = batch(
        "run", "--input", "items.csv", "--out", "out.jsonl", "--id-field", "id",
        "--agent", AGENT, "--progress", "none", cwd=tmp_path,
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    assert "b" in by_id(tmp_path / "out.jsonl"), "the other rows run"


def _ids_and_lines(
    path: Path, id_field: str | None = "id"
) -> tuple[list[tuple[str, int]], list[int]]:
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
    assert _ids_and_lines(path) == ([("a", 1), ("b", 2), ("c", 3)], [])


def test_a_csv_cell_over_128_kib_is_read_not_raised_as_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "items.csv"
    path.write_text("id,text\na," + "x" * 200_000 + "\nb,short\n")
    items, malformed = _ids_and_lines(path)  # csv.Error: field larger than field limit (131072)
    assert ("b", 3) in items
    assert [i for i, _ in items] == ["a", "b"] or malformed == [2]


def test_a_line_that_is_not_utf8_is_malformed_with_its_number_and_the_others_run(
    tmp_path: Path,
) -> None:
    path = tmp_path / "items.jsonl"
    path.write_bytes(b'{"id": "a"}\n{"id": "caf\xe9"}\n{"id": "c"}\n')
    # One bad line is one malformed item, not a refusal of the whole input.
    assert _ids_and_lines(path) == ([("a", 1), ("c", 3)], [2])


def test_blank_lines_before_a_csv_header_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "items.csv"
    path.write_text("\nid,text\na,1\nb,2\n")
    # Taken as the header, the blank line has no columns, and every row is "2 fields
    # where the header has 0".
    assert _ids_and_lines(path) == ([("a", 3), ("b", 4)], [])


def test_a_multiline_csv_record_is_numbered_by_the_line_it_starts_on(tmp_path: Path) -> None:
    path = tmp_path / "items.csv"
    path.write_text('text,n\n"two\nlines",1\nplain,2\n')
    # An editor shows the first record on line 2; csv's line_num is the line it ends on.
    assert _ids_and_lines(path, id_field=None) == ([("2", 2), ("4", 4)], [])


def _items(path: Path, id_field: str | None = None) -> list[tuple[str, int, dict[str, object]]]:
    found = read_items(str(path), id_field=id_field, fmt=None, rename_duplicates=False)
    assert found.malformed == []
    return [(i.id, i.line, i.fields) for i in found.items]


def test_a_csv_with_cr_line_endings_is_read_not_raised(tmp_path: Path) -> None:
    # Classic Mac line endings (Excel's "CSV (Macintosh)"): the csv module reads them,
    # and so must the unterminated-quote check, which counting only "\n" would raise
    # ValueError.
    path = tmp_path / "items.csv"
    path.write_bytes(b"id,v\r1,a\r2,b\r")
    assert [(i, f) for i, _, f in _items(path, "id")] == [
        ("1", {"id": "1", "v": "a"}),
        ("2", {"id": "2", "v": "b"}),
    ]


def test_a_quoted_cr_in_a_csv_cell_shifts_no_later_line_number(tmp_path: Path) -> None:
    # A bare "\r" inside a quoted cell is no line end for an editor (nor for the JSONL
    # reader, which ends lines at "\n" only), but reader.line_num counts it as one: read
    # so, every later record is numbered one too high, and its default id changes.
    path = tmp_path / "items.csv"
    path.write_bytes(b'id,v\n1,"a\rb"\n2,c\n')
    assert [(i, line) for i, line, _ in _items(path)] == [("2", 2), ("3", 3)]


def test_a_jsonl_integer_beyond_64_bits_is_kept_exact(tmp_path: Path) -> None:
    # orjson reads an integer over 64 bits as a float: 18446744073709551616 would become
    # 1.8446744073709552e+19, filled into {n} and sent on stdin so, and as an --id-field
    # no usable id at all.
    path = tmp_path / "items.jsonl"
    path.write_text('{"id": 18446744073709551616, "n": 123456789012345678901234567890}\n')
    [(item_id, _, fields)] = _items(path, "id")
    assert item_id == "18446744073709551616"
    assert fields["n"] == 123456789012345678901234567890


def test_json_writes_an_integer_beyond_64_bits_exactly_and_refuses_what_it_refused() -> None:
    """The fallback to the stdlib is for orjson's refused integers only: a value orjson
    refuses for another reason (a key that is not text) is still refused."""
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
