"""ctx.report: partial output and changed files cost time linear in what is reported and
memory bounded by the documented caps, and the envelope says what it dropped."""

from __future__ import annotations

import time

import anyio
import pytest

from subagents import Request, RunContext, Status
from subagents._progress import MAX_FILES, MAX_OUTPUT_CHARS, Progress
from tests.helpers import manager_with, spec


def _seconds_to_report(count: int) -> float:
    """The best of three runs of a runner calling ``ctx.report`` ``count`` times."""
    timings: list[float] = []

    async def reporter(request: Request, ctx: RunContext) -> str:
        began = time.perf_counter()
        for i in range(count):
            ctx.report(append="twenty-five characters..", files_changed=[f"src/{i}.py"])
        timings.append(time.perf_counter() - began)
        raise RuntimeError("keep the partial output")

    async def main() -> None:
        async with manager_with(spec("r", reporter)) as manager:
            envelope = await manager.spawn("r").wait()
            assert len(envelope.output) == 24 * count
            assert len(envelope.files_changed) == min(count, MAX_FILES)

    for _ in range(3):
        anyio.run(main)
    return min(timings)


def test_reporting_scales_linearly() -> None:
    """Eight times the reports take about eight times as long (a quadratic one: 64). The
    bound sits three times above linear, so a loaded machine's stalls do not fail it."""
    small, large = _seconds_to_report(5_000), _seconds_to_report(40_000)
    assert large / small < 24, (small, large)


def test_output_past_the_cap_keeps_the_head_and_counts_the_rest() -> None:
    progress = Progress()
    progress.append("a" * (MAX_OUTPUT_CHARS - 10))
    progress.append("b" * 30)
    progress.append("c" * 5)
    assert progress.output_chars == MAX_OUTPUT_CHARS + 25
    text = progress.output()
    assert text.startswith("a" * (MAX_OUTPUT_CHARS - 10) + "b" * 10 + "\n")
    assert text.endswith("[… 25 characters dropped …]")
    progress.replace("fresh")
    assert progress.output() == "fresh"


def test_files_keep_first_seen_order_without_repeats_up_to_the_cap() -> None:
    progress = Progress()
    progress.add_files(["b.py", "a.py", "b.py"])
    assert progress.files(["a.py", "c.py"]) == ("b.py", "a.py", "c.py")
    progress.add_files(f"f{i}.py" for i in range(2 * MAX_FILES))
    files = progress.files()
    assert len(files) == MAX_FILES
    assert files[-1] == f"[… {2 * MAX_FILES + 2 - (MAX_FILES - 1)} more paths]"


@pytest.mark.anyio
async def test_a_runner_reporting_piece_by_piece_gets_it_all_in_its_envelope() -> None:
    async def streamer(request: Request, ctx: RunContext) -> str:
        for i in range(10_000):
            ctx.report(append=f"{i},", files_changed=[f"f{i % 1500}.py"] if i < 1500 else [])
        raise RuntimeError("stopped after streaming")

    async with manager_with(spec("s", streamer)) as manager:
        envelope = await manager.spawn("s").wait()
    assert envelope.status is Status.ERROR
    assert envelope.output == "".join(f"{i}," for i in range(10_000))
    assert len(envelope.files_changed) == MAX_FILES
    assert envelope.files_changed[0] == "f0.py"
    assert envelope.files_changed[-1] == f"[… {1500 - MAX_FILES + 1} more paths]"


def test_a_list_reported_again_each_turn_counts_each_dropped_path_once() -> None:
    progress = Progress()
    paths = [f"f{i}.py" for i in range(MAX_FILES + 500)]
    for turn in range(1, 16):
        progress.add_files(paths[: turn * 100])
    assert progress.files()[-1] == "[… 501 more paths]"


def test_a_later_attempts_progress_follows_the_earlier_ones_as_one_progress_would() -> None:
    earlier, later, replacing = Progress(), Progress(), Progress()
    earlier.append("one ")
    earlier.add_files(["a.py", "b.py"])
    later.append("two")
    later.add_files(["b.py", "c.py"])
    replacing.replace("fresh")
    merged = earlier.followed_by(later, replaced=False)
    assert merged.output() == "one two"
    assert merged.files() == ("a.py", "b.py", "c.py")
    assert earlier.followed_by(replacing, replaced=True).output() == "fresh"
    assert earlier.output() == "one "  # neither is changed
    assert later.output() == "two"


def test_merged_progress_keeps_the_caps_and_counts_what_both_dropped() -> None:
    earlier, later = Progress(), Progress()
    earlier.append("a" * (MAX_OUTPUT_CHARS - 5))
    earlier.add_files(f"e{i}.py" for i in range(MAX_FILES - 1))
    later.append("b" * (MAX_OUTPUT_CHARS + 7))
    later.add_files(f"l{i}.py" for i in range(MAX_FILES + 2))
    merged = earlier.followed_by(later, replaced=False)
    assert merged.output_chars == earlier.output_chars + later.output_chars
    assert merged.output().endswith(f"[… {MAX_OUTPUT_CHARS + 2} characters dropped …]")
    files = merged.files()
    assert len(files) == MAX_FILES
    assert files[-1] == f"[… {MAX_FILES + 2} more paths]"
