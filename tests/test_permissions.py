"""Ruleset: allow/deny over tool names; a child's effective ruleset is never broader."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from subagents import Request, Ruleset, RunContext
from tests.helpers import manager_with, spec

TOOLS = ["read", "read_file", "write", "write_file", "shell", "spawn_agent", "wait_agent", "x"]
PATTERNS = st.sampled_from(["*", "read*", "write*", "*_file", "shell", "*agent", "x", "?"])
rulesets = st.builds(
    Ruleset,
    allow=st.lists(PATTERNS, max_size=3).map(tuple),
    deny=st.lists(PATTERNS, max_size=2).map(tuple),
)


def test_allow_and_deny() -> None:
    rules = Ruleset(allow=("read*", "shell"), deny=("read_secret",))
    assert rules.allows("read_file")
    assert rules.allows("shell")
    assert not rules.allows("read_secret")  # deny wins
    assert not rules.allows("write_file")  # not allowed
    assert rules.filter(TOOLS) == ["read", "read_file", "shell"]


def test_defaults_and_helpers() -> None:
    assert Ruleset().allows("anything")
    assert Ruleset.allow_all().allows("anything")
    assert not Ruleset.deny_all().allows("read")
    assert Ruleset(allow="read").allow == ("read",)  # a bare string is one pattern


def test_intersect_is_restrict_only() -> None:
    parent = Ruleset(allow=("read*", "write*"))
    child = Ruleset(allow=("*",), deny=("write_file",))
    eff = child & parent
    assert eff.allows("read")
    assert eff.allows("write")
    assert not eff.allows("write_file")  # the child's deny
    assert not eff.allows("shell")  # the parent's limit


@given(rulesets, rulesets, rulesets)
@settings(max_examples=300, deadline=None)
def test_intersection_is_exactly_both(a: Ruleset, b: Ruleset, c: Ruleset) -> None:
    ab = a.intersect(b)
    abc = ab & c
    for tool in TOOLS:
        assert ab.allows(tool) == (a.allows(tool) and b.allows(tool))
        assert abc.allows(tool) == (a.allows(tool) and b.allows(tool) and c.allows(tool))
        # never broader than either side
        if ab.allows(tool):
            assert a.allows(tool)
            assert b.allows(tool)


@given(rulesets, rulesets, rulesets)
@settings(max_examples=50, deadline=None)
def test_child_effective_permissions_within_ancestors(
    root: Ruleset, mid: Ruleset, leaf: Ruleset
) -> None:
    import anyio

    seen: dict[str, Ruleset] = {}

    async def leaf_runner(request: Request, ctx: RunContext) -> str:
        seen["leaf"] = ctx.permissions
        return ""

    async def mid_runner(request: Request, ctx: RunContext) -> str:
        seen["mid"] = ctx.permissions
        await ctx.execute("leaf")
        return ""

    async def main() -> None:
        async with manager_with(
            spec("mid", mid_runner, permissions=mid),
            spec("leaf", leaf_runner, permissions=leaf),
            permissions=root,
        ) as manager:
            await manager.spawn("mid").wait()

    anyio.run(main)
    for tool in TOOLS:
        assert seen["mid"].allows(tool) == (root.allows(tool) and mid.allows(tool))
        assert seen["leaf"].allows(tool) == (
            root.allows(tool) and mid.allows(tool) and leaf.allows(tool)
        )


@pytest.mark.anyio
async def test_ctx_allows_uses_effective_ruleset() -> None:
    answers: list[bool] = []

    async def runner(request: Request, ctx: RunContext) -> str:
        answers.extend([ctx.allows("read"), ctx.allows("shell")])
        return ""

    async with manager_with(
        spec("w", runner, permissions=Ruleset(allow=("read", "shell"))),
        permissions=Ruleset(deny=("shell",)),
    ) as manager:
        await manager.spawn("w").wait()
    assert answers == [True, False]
