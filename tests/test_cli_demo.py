"""``subagents demo`` and ``subagents --version``: reproducible runs, one-line errors."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import anyio
import pytest

from subagents import DelegateResult, Status, Usage
from subagents._cli import main
from subagents._demo import _line
from subagents._json import loads

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, pythonpath: tuple[Path, ...] = ()) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(str(p) for p in (*pythonpath, ROOT))
    return subprocess.run(
        [sys.executable, "-m", "subagents", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": path},
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0]


@pytest.mark.parametrize("where", ["directory", "missing parent"])
def test_demo_events_path_that_cannot_be_written_is_a_one_line_error(
    tmp_path: Path, where: str
) -> None:
    target = tmp_path if where == "directory" else tmp_path / "no" / "such" / "events.jsonl"
    proc = run_cli("demo", "--events", str(target))
    reason = "Is a directory" if where == "directory" else "No such file or directory"
    assert_one_line_error(proc, "subagents demo", str(target), reason)
    assert proc.stdout == ""  # refused before any agent ran


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")
def test_demo_whose_event_log_fails_to_write_finishes_then_exits_1_in_one_line() -> None:
    """Every write to /dev/full fails (ENOSPC): the demo still runs to its summary, then
    says in one line that the log is incomplete, and the status says the run failed."""
    proc = run_cli("demo", "--events", "/dev/full")
    assert_one_line_error(proc, "subagents demo", "/dev/full", "No space left on device")
    assert "incomplete" in proc.stderr
    assert "14 envelopes in" in proc.stdout


def test_version_comes_from_the_package_metadata(tmp_path: Path) -> None:
    # A dist-info earlier on the path than any installed copy: the version printed must be
    # the one the metadata declares, whatever is installed in the environment.
    info = tmp_path / "subagents-9.8.7.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: subagents\nVersion: 9.8.7\n")
    proc = run_cli("--version", pythonpath=(tmp_path,))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "subagents 9.8.7"


def test_version_without_metadata_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from importlib import metadata

    def not_installed(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert "version unknown" in capsys.readouterr().out


def _demo_envelopes(
    capsys: pytest.CaptureFixture[str], seed: int, backend: str
) -> dict[str, tuple[object, ...]]:
    assert main(["demo", "--json", "--seed", str(seed), "--backend", backend]) == 0
    lines = capsys.readouterr().out.splitlines()
    envelopes = [DelegateResult.from_dict(loads(line)) for line in lines]
    # Ids, timestamps and durations are the clock's; everything else is the seed's.
    return {
        str(e.agent_path): (e.status, e.output, e.error, e.usage, e.iterations) for e in envelopes
    }


def _tokens(envelopes: dict[str, tuple[object, ...]]) -> Usage:
    total = Usage()
    for fields in envelopes.values():
        usage = fields[3]
        assert isinstance(usage, Usage)
        total += usage
    return total


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_demo_same_seed_same_envelopes_however_the_children_interleave(
    backend: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    first = _demo_envelopes(capsys, seed=11, backend=backend)
    real_sleep = anyio.sleep

    async def reversed_steps(seconds: float) -> None:
        # The researchers' steps (20-80 ms) now wake in the opposite order; the demo's
        # other waits (the 50 ms failure, the 60 s scan) are kept.
        await real_sleep(0.1 - seconds if 0 < seconds < 0.09 else seconds)

    monkeypatch.setattr(anyio, "sleep", reversed_steps)
    second = _demo_envelopes(capsys, seed=11, backend=backend)
    assert len(first) == 14
    assert _tokens(second) == _tokens(first)
    assert second == first
    monkeypatch.undo()
    assert _demo_envelopes(capsys, seed=12, backend=backend) != first  # the seed matters


def test_demo_lead_line_says_its_output_has_two_parts_and_is_cut(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["demo"]) == 0
    lead = next(line for line in capsys.readouterr().out.splitlines() if "/root/lead " in line)
    assert "2 parts: Summary of the design notes (part 1)" in lead
    assert lead.endswith(" chars)")


def test_demo_line_marks_what_it_cut() -> None:
    envelope = DelegateResult(
        agent="a", task_id="t", status=Status.COMPLETED, output="x" * 100, agent_path="/root/a"
    )
    line = _line(envelope)
    assert line.endswith("… (+50 chars)")
    kept = line.split("  ")[-1].removesuffix("… (+50 chars)")
    assert kept == "x" * 50
    short = DelegateResult(
        agent="a", task_id="t", status=Status.COMPLETED, output="fits", agent_path="/root/a"
    )
    assert _line(short).endswith("  fits")


def test_demo_on_a_backend_that_is_not_installed_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import subagents._demo as demo

    # private: no public way to hide an installed trio from the demo's lookup of it.
    monkeypatch.setattr(demo, "find_spec", lambda name: None if name == "trio" else object())
    assert main(["demo", "--backend", "trio"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "subagents demo: --backend trio needs the trio package (pip install trio)\n"
    )


def _demo(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "subagents", "demo", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_demo_prints_one_line_per_child_with_each_ending() -> None:
    proc = _demo()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    lines = out.splitlines()
    landed = [
        line
        for line in lines
        if line.split(" ", 1)[0] in {s.value for s in Status} and " /root" in line
    ]
    assert len(landed) == 14  # twelve spawns and two grandchildren, one line each
    statuses = Counter(line.split(" ", 1)[0] for line in landed)
    assert statuses["error"] == 1
    assert statuses["timeout"] == 1
    assert statuses["cancelled"] == 1
    assert statuses["completed"] == 11
    grandchildren = [line for line in landed if line.split()[1].count("/") == 3]
    assert len(grandchildren) == 2
    assert "total" in out  # the summary table
    assert "Traceback" not in err


def test_demo_piped_into_head_exits_without_a_traceback() -> None:
    proc = _demo("--json")
    assert proc.stdout is not None
    proc.stdout.readline()
    proc.stdout.close()  # the reader leaves, like `subagents demo | head -1`
    proc.wait(timeout=60)
    assert proc.stderr is not None
    err = proc.stderr.read()
    proc.stderr.close()
    assert "Traceback" not in err
    assert "BrokenPipe" not in err
