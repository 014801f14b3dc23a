"""AgentPath (the delegation tree) and unique child naming (-2, -3 suffixes)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from subagents import AgentPath, InvalidName, Request, RunContext, SpawnOptions
from subagents._paths import MAX_NAME_LENGTH, NameAllocator
from tests.helpers import Tracker, echo, manager_with, spec


def test_root_is_slash_root() -> None:
    root = AgentPath.root()
    assert root == "/root"
    assert str(root) == "/root"
    assert root.depth == 0
    assert root.parent() is None
    assert root.name == "root"


def test_join_parent_depth_str() -> None:
    a = AgentPath.root().join("a")
    b = a.join("b-2")
    assert isinstance(b, AgentPath)
    assert str(a) == "/root/a"
    assert str(b) == "/root/a/b-2"
    assert b.depth == 2
    assert a.depth == 1
    assert b.parent() == a
    assert b.parent().parent() == AgentPath.root()  # type: ignore[union-attr]
    assert b.segments == ("root", "a", "b-2")
    assert b.name == "b-2"


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("", "empty"),
        ("a/b", "/"),
        ("x" * (MAX_NAME_LENGTH + 1), "at most"),
        ("-lead", "letters"),
        ("has space", "letters"),
        ("ünï", "letters"),
        (".", "letters"),
    ],
)
def test_join_rejects_bad_segments(name: str, reason: str) -> None:
    with pytest.raises(InvalidName, match=reason) as info:
        AgentPath.root().join(name)
    assert isinstance(info.value, ValueError)
    assert info.value.name == name


def test_join_accepts_documented_charset() -> None:
    for name in ("a", "A9", "x_y", "x-y", "v1.2", "x" * MAX_NAME_LENGTH):
        assert AgentPath.root().join(name).name == name


def test_parse_validates_every_segment() -> None:
    assert AgentPath("/root/a/b").depth == 2
    for bad in ("root/a", "/root//a", "/root/a/", "/root/a b"):
        with pytest.raises(InvalidName):
            AgentPath(bad)


def test_name_allocator_suffixes_case_insensitive() -> None:
    names = NameAllocator()
    assert names.allocate("worker") == "worker"
    assert names.allocate("worker") == "worker-2"
    assert names.allocate("Worker") == "Worker-3"
    assert names.allocate("WORKER") == "WORKER-4"
    assert names.allocate("other") == "other"


def test_name_allocator_skips_taken_suffixes_and_stays_bounded() -> None:
    names = NameAllocator()
    assert names.allocate("a-2") == "a-2"
    assert names.allocate("a") == "a"
    assert names.allocate("a") == "a-3"  # a-2 is taken literally
    long = "n" * MAX_NAME_LENGTH
    assert names.allocate(long) == long
    second = names.allocate(long)
    assert second.endswith("-2")
    assert len(second) <= MAX_NAME_LENGTH
    AgentPath.root().join(second)


@pytest.mark.anyio
async def test_spawned_names_get_suffixes_under_one_parent() -> None:
    tracker = Tracker()
    async with manager_with(spec("general", tracker.runner), spec("echo", echo)) as manager:
        h1 = manager.spawn("general", "1")
        h2 = manager.spawn("general", "2")
        h3 = manager.spawn("general", "3", name="GENERAL")
        h4 = manager.spawn("echo", "4", name="General")
        other = manager.spawn("general", "5", session_id="other")
        h5 = manager.spawn("echo", "6", options=SpawnOptions(name="general"))
        assert h1.agent_path == "/root/general"
        assert h2.agent_path == "/root/general-2"
        assert h3.agent_path == "/root/GENERAL-3"
        assert h4.agent_path == "/root/General-4"
        assert other.agent_path == "/root/general"  # another parent: its own namespace
        assert h5.agent_path == "/root/general-5"  # the name given through SpawnOptions
        tracker.open()
        for h in (h1, h2, h3, h4, h5, other):
            assert (await h.wait()).agent_path == h.agent_path


@pytest.mark.anyio
async def test_nested_children_have_their_own_namespace() -> None:
    async def parent(request: Request, ctx: RunContext) -> str:
        a = await ctx.execute("echo", "x")
        b = await ctx.execute("echo", "y")
        return f"{a.agent_path} {b.agent_path}"

    async with manager_with(spec("parent", parent), spec("echo", echo)) as manager:
        env = await manager.spawn("parent").wait()
    assert env.output == "/root/parent/echo /root/parent/echo-2"


class _ReferenceAllocator:
    """The allocator's rule spelled out with a set of every name given out."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def allocate(self, name: str) -> str:
        n = 1
        while True:
            suffix = "" if n == 1 else f"-{n}"
            candidate = name[: MAX_NAME_LENGTH - len(suffix)] + suffix if suffix else name
            if candidate.lower() not in self.used:
                self.used.add(candidate.lower())
                return candidate
            n += 1


_NAMES = st.sampled_from(
    ["quick", "Quick", "quick-2", "quick-3", "quick-02", "a", "a-2", "a-2-2", "x" * 64, "x" * 62]
)


@given(st.lists(_NAMES, max_size=60))
def test_allocator_gives_what_a_set_of_every_name_would(names: list[str]) -> None:
    """The compact allocator (a counter per stem) gives the names a set of every name
    given out would, whatever the mix of plain, suffixed and overlong names."""
    compact, reference = NameAllocator(), _ReferenceAllocator()
    given_out = [compact.allocate(n) for n in names]
    assert given_out == [reference.allocate(n) for n in names]
    assert len({g.lower() for g in given_out}) == len(given_out)


def test_allocator_memory_grows_with_distinct_names_not_children() -> None:
    allocator = NameAllocator()
    for _ in range(10_000):
        allocator.allocate("quick")
    assert allocator.allocate("quick") == "quick-10001"
    # private: no public view of the allocator's state, and the point is its size.
    assert len(allocator._taken) == 1
