"""DelegateResult: JSON shape, round trips, the compact text view, exception summaries."""

from __future__ import annotations

import re
import time

import anyio
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from subagents import AgentSpec, DelegateResult, Request, RunContext, Status, Usage
from subagents._envelope import describe_exception
from tests.helpers import manager_with, spec

# Text with BMP, astral (emoji, CJK extension B) and combining code points, no surrogates.
UNICODE = st.text(
    alphabet=st.one_of(
        st.characters(blacklist_categories=["Cs"]),
        st.sampled_from(["😀", "𝄞", "𠀋", "é", "\u0301", "\n", "x"]),
    ),
    max_size=3000,
)
NAMES = st.from_regex(r"[a-z][a-z0-9_-]{0,20}", fullmatch=True)
ERROR_STATUSES = (Status.ERROR, Status.TIMEOUT)
MARKER = re.compile(r"\n\[… (\d+) characters truncated …\]\n")


def make(**kw: object) -> DelegateResult:
    base: dict[str, object] = {"agent": "worker", "task_id": "abc123def456", "status": "completed"}
    base.update(kw)
    base["status"] = Status(base["status"])
    return DelegateResult(**base)  # type: ignore[arg-type]


envelopes = st.builds(
    DelegateResult,
    agent=NAMES,
    task_id=st.text(min_size=1, max_size=20),
    status=st.sampled_from(list(Status)),
    output=st.text(max_size=200),
    files_changed=st.lists(st.text(max_size=20), max_size=5).map(tuple),
    error=st.text(max_size=100),
    error_type=st.text(max_size=30),
    duration_ms=st.integers(0, 10**9),
    queue_ms=st.integers(0, 10**9),
    iterations=st.integers(0, 1000),
    attempts=st.integers(1, 10),
    usage=st.builds(Usage, input_tokens=st.integers(0, 10**7), output_tokens=st.integers(0, 10**7)),
    timestamp_ms=st.integers(0, 2**42),
    agent_path=st.sampled_from(["", "/root/a", "/root/a/b-2"]),
    parent_path=st.sampled_from(["", "/root", "/root/a"]),
)


# ---------------------------------------------------------------- to_dict / to_json


def test_to_dict_omits_empty_optional_fields() -> None:
    data = make().to_dict()
    for key in ("output", "files_changed", "error", "error_type", "agent_path", "parent_path"):
        assert key not in data, key
    assert "queue_ms" not in data  # 0 is empty
    assert "attempts" not in data  # 1 is the default
    assert data["agent"] == "worker"
    assert data["task_id"] == "abc123def456"
    assert data["status"] == "completed"


def test_to_dict_keeps_present_optional_fields() -> None:
    env = make(
        status="error",
        output="out",
        files_changed=("a.py",),
        error="boom",
        error_type="ValueError",
        queue_ms=5,
        attempts=3,
        agent_path="/root/worker",
        parent_path="/root",
    )
    data = env.to_dict()
    assert data["output"] == "out"
    assert data["files_changed"] == ["a.py"]
    assert data["error"] == "boom"
    assert data["error_type"] == "ValueError"
    assert data["queue_ms"] == 5
    assert data["attempts"] == 3
    assert data["agent_path"] == "/root/worker"
    assert data["parent_path"] == "/root"


def test_to_json_is_orjson_of_to_dict_and_omits_empty() -> None:
    env = make(output="héllo 😀")
    raw = env.to_json()
    assert isinstance(raw, bytes)
    decoded = orjson.loads(raw)
    assert decoded == env.to_dict()
    assert "error" not in decoded
    assert decoded["output"] == "héllo 😀"


def test_times_are_integer_unix_milliseconds() -> None:
    before = time.time_ns() // 1_000_000
    env = make(duration_ms=1234)
    after = time.time_ns() // 1_000_000
    data = orjson.loads(env.to_json())
    assert type(data["timestamp_ms"]) is int
    assert before <= data["timestamp_ms"] <= after
    assert type(data["duration_ms"]) is int


def test_from_dict_round_trip_full() -> None:
    env = make(
        status="timeout",
        output="partial",
        files_changed=("a", "b"),
        error="watchdog",
        error_type="timeout",
        duration_ms=10,
        queue_ms=3,
        iterations=2,
        attempts=2,
        usage=Usage(input_tokens=5, output_tokens=7),
        agent_path="/root/worker",
        parent_path="/root",
    )
    assert DelegateResult.from_dict(env.to_dict()) == env
    assert DelegateResult.from_dict(orjson.loads(env.to_json())) == env


@given(envelopes)
@settings(max_examples=200, deadline=None)
def test_from_dict_round_trip_property(env: DelegateResult) -> None:
    assert DelegateResult.from_dict(env.to_dict()) == env
    assert DelegateResult.from_dict(orjson.loads(env.to_json())) == env


@pytest.mark.parametrize(
    "data",
    [
        {"task_id": "t", "status": "completed"},
        {"agent": "a", "task_id": "t", "status": "bogus"},
        {"agent": "a", "task_id": "t", "status": "completed", "duration_ms": "5"},
        {"agent": "a", "task_id": "t", "status": "completed", "files_changed": "abc"},
    ],
)
def test_from_dict_rejects_malformed(data: dict[str, object]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - each case has its own message
        DelegateResult.from_dict(data)


# ---------------------------------------------------------------- truncated()


def test_truncated_has_header_and_output() -> None:
    env = make(
        output="the answer is 42",
        duration_ms=1500,
        usage=Usage(input_tokens=10, output_tokens=20),
        agent_path="/root/worker",
    )
    text = env.truncated()
    assert "worker" in text
    assert "abc123def456" in text
    assert "/root/worker" in text
    assert "completed" in text
    assert "1500" in text
    assert "tokens in 10 / out 20" in text
    assert text.endswith("the answer is 42")
    assert "hint" not in text


def test_truncated_default_is_2000_chars() -> None:
    text = make(output="x" * 10_000).truncated()
    assert 1990 <= len(text) <= 2000  # the default bound (2000) is used when output is long


def test_truncated_cuts_by_code_points_with_marker() -> None:
    output = "😀" * 5000  # 4 bytes each in UTF-8: a byte cut would give a different count
    text = make(output=output).truncated(max_chars=500)
    assert len(text) <= 500
    assert "😀" in text
    # the marker says exactly how many code points were left out
    shown = text.count("😀")
    assert f"{5000 - shown} characters truncated" in text
    text.encode("utf-8")  # never half a code point


@pytest.mark.parametrize("status", [Status.ERROR, Status.TIMEOUT])
@pytest.mark.parametrize("max_chars", [200, 300, 500, 800, 2000])
def test_error_and_timeout_views_end_with_hint(status: Status, max_chars: int) -> None:
    env = make(
        status=status,
        output="y" * 10_000,
        error="ValueError: " + "z" * 600,
        agent_path="/root/worker",
    )
    text = env.truncated(max_chars=max_chars)
    assert len(text) <= max_chars
    last = text.splitlines()[-1]
    assert last.startswith("hint:"), text[-200:]
    assert "truncated" in text  # the output was cut, visibly


def test_success_view_has_no_hint() -> None:
    assert "hint:" not in make(output="y" * 10_000).truncated(max_chars=300)


@given(
    output=UNICODE,
    error=st.text(max_size=700),
    status=st.sampled_from(list(Status)),
    max_chars=st.integers(min_value=1, max_value=4000),
)
@settings(max_examples=300, deadline=None)
def test_truncated_never_exceeds_max_chars(
    output: str, error: str, status: Status, max_chars: int
) -> None:
    env = make(status=status, output=output, error=error, agent_path="/root/a/b")
    text = env.truncated(max_chars=max_chars)
    assert len(text) <= max_chars
    text.encode("utf-8")
    if output and output not in text and max_chars >= 250:
        assert "characters truncated" in text  # a cut is always visible
    if status in ERROR_STATUSES and max_chars >= 250:
        assert text.splitlines()[-1].startswith("hint:")


@given(output=UNICODE, max_chars=st.integers(min_value=300, max_value=3000))
@settings(max_examples=200, deadline=None)
def test_truncated_marker_counts_omitted_code_points(output: str, max_chars: int) -> None:
    text = make(output=output).truncated(max_chars=max_chars)
    body = text[text.index("output:\n") + len("output:\n") :]
    if body == output or not output:
        assert body == (output or "(no output)")
        return
    match = MARKER.search(body)
    assert match is not None, body
    prefix, suffix = body[: match.start()], body[match.end() :]
    assert output.startswith(prefix)
    assert output.endswith(suffix)
    assert int(match.group(1)) == len(output) - len(prefix) - len(suffix)


def test_truncated_rejects_nonpositive() -> None:
    with pytest.raises(ValueError, match="max_chars"):
        make().truncated(max_chars=0)


# ---------------------------------------------------------------- exceptions


def test_describe_exception_is_bounded_and_has_no_traceback() -> None:
    try:
        raise ValueError("bad " * 1000)
    except ValueError as exc:
        error_type, message = describe_exception(exc)
    assert error_type == "ValueError"
    assert message.startswith("ValueError: bad")
    assert len(message) <= 500
    assert "Traceback" not in message


@pytest.mark.anyio
async def test_runner_exception_becomes_short_error_envelope() -> None:
    async def runner(request: Request, ctx: RunContext) -> str:
        raise RuntimeError("disk on fire " + "x" * 5000)

    events: list[dict[str, object]] = []
    async with manager_with(spec("worker", runner)) as manager:
        manager.events.subscribe(
            lambda e: events.append(e.data) if e.type == "subagent.completed" else None
        )
        env = await manager.spawn("worker", "go").wait()
    assert env.status is Status.ERROR
    assert env.error_type == "RuntimeError"
    assert env.error.startswith("RuntimeError: disk on fire")
    assert len(env.error) <= 500
    view = env.truncated()
    assert "Traceback" not in view
    assert "disk on fire" in view
    assert view.splitlines()[-1].startswith("hint:")
    # the full text (traceback) belongs to the event payload
    (data,) = events
    assert "Traceback" in str(data.get("traceback", ""))
    assert data["status"] == "error"


def test_agent_spec_helper_is_agentspec() -> None:
    async def runner(request: Request, ctx: RunContext) -> str:
        return ""

    assert isinstance(spec("a", runner), AgentSpec)


def test_status_given_as_text_is_converted() -> None:
    env = DelegateResult(agent="a", task_id="t", status="completed")  # type: ignore[arg-type]
    assert env.status is Status.COMPLETED
    assert env.ok
    assert env.to_dict()["status"] == "completed"
    assert "completed" in env.truncated()
    with pytest.raises(ValueError, match="bogus"):
        DelegateResult(agent="a", task_id="t", status="bogus")  # type: ignore[arg-type]


def test_lone_surrogates_are_replaced_in_output_files_and_error() -> None:
    env = DelegateResult(
        agent="a",
        task_id="t1",
        status=Status.ERROR,
        output="out \udcff",
        files_changed=("f\udc80.py", "g.py"),
        error="bad \udcfe",
    )
    assert (env.output, env.files_changed, env.error) == ("out ?", ("f?.py", "g.py"), "bad ?")
    assert orjson.loads(env.to_json())["output"] == "out ?"


def test_trusted_envelope_equals_the_attrs_built_one() -> None:
    """The runtime's fast constructor gives the same envelope as DelegateResult(...),
    text cleaned of lone surrogates included (equality, hash, dict, repr)."""
    from subagents._envelope import trusted_envelope

    values = {
        "agent": "a",
        "task_id": "t1",
        "status": Status.ERROR,
        "output": "out \udcff",
        "files_changed": ("f\udc80.py", "g.py"),
        "error": "bad \udcfe",
        "error_type": "ValueError",
        "duration_ms": 5,
        "queue_ms": 2,
        "iterations": 3,
        "attempts": 2,
        "usage": Usage(input_tokens=1, output_tokens=2),
        "timestamp_ms": 1234,
        "agent_path": "/root/a",
        "parent_path": "/root",
        "tree_usage": Usage(input_tokens=5, output_tokens=7),
    }
    fast = trusted_envelope(*values.values())
    slow = DelegateResult(**values)  # type: ignore[arg-type]
    assert fast == slow
    assert hash(fast) == hash(slow)
    assert fast.to_dict() == slow.to_dict()
    assert repr(fast) == repr(slow)
    assert "\udcff" not in fast.output
    assert fast.to_json()
    bare = {**values, "files_changed": (), "error": ""}
    assert trusted_envelope(*bare.values()) == DelegateResult(**bare)  # type: ignore[arg-type]


def test_status_is_a_str_enum_of_the_four_endings() -> None:
    assert {s.value for s in Status} == {"completed", "error", "timeout", "cancelled"}
    assert Status.COMPLETED == "completed"
    assert Status("timeout") is Status.TIMEOUT
    assert isinstance(Status.ERROR, str)


@pytest.mark.parametrize("max_chars", [40, 120, 200, 300, 1000, 2000])
@pytest.mark.parametrize("status", list(Status))
def test_a_huge_output_is_cut_to_max_chars_with_the_marker_in_view(
    max_chars: int, status: Status
) -> None:
    env = make(
        status=status,
        output="😀" * 5000,
        error="E" * 5000 if status != Status.COMPLETED else "",
        agent_path="/root/general",
        parent_path="/root",
        usage=Usage(input_tokens=10, output_tokens=5),
    )
    text = env.truncated(max_chars)
    assert len(text) <= max_chars
    # the docstring says marker and hint stay visible down to about 200 characters
    if max_chars >= 200:
        assert "truncated" in text


@pytest.mark.anyio
async def test_an_error_inside_a_runners_task_group_is_described_by_the_error() -> None:
    async def grouped(request: Request, ctx: RunContext) -> str:
        async def fail() -> None:
            raise KeyError("missing-key")

        async with anyio.create_task_group() as tg:
            tg.start_soon(fail)
            await anyio.sleep_forever()
        return ""

    async with manager_with(spec("g", grouped)) as m:
        env = await m.spawn("g", "x").wait()
    assert env.status == Status.ERROR
    assert env.error.startswith("KeyError")
    assert "missing-key" in env.error
    assert env.error_type == "KeyError"
