"""``subagents batch run --input``: JSONL, CSV and stdin; ids, duplicates, malformed lines."""

from __future__ import annotations

from pathlib import Path

from subagents._cli_batch_inputs import read_items
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
