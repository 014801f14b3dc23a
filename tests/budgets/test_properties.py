"""Properties of budgets and fan-out limits over random delegation trees built through
every spawn path (``spawn``, ``execute``, the ``spawn_agent`` and ``delegate_to_agent``
tools, at the root and nested in a runner), on asyncio and trio:

* a child's effective budget is never larger than what its parent had left;
* the usage charged to a tree is the sum of the usage its agents reported;
* no path exceeds ``max_children``, ``max_agents`` or ``max_depth``, and every refusal
  names a limit that really was reached;
* every spawn ends in exactly one envelope.
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import anyio
import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from subagents import (
    Budget,
    DelegateResult,
    Event,
    Request,
    RunContext,
    SpawnHandle,
    SpawnRejected,
    SubagentConfig,
    SubagentManager,
    Usage,
)
from subagents._account import remaining
from subagents._events import COMPLETED, SPAWNED
from subagents._manager import budgets_of
from subagents._paths import AgentPath
from subagents.tools import Toolset, build_tools
from tests.helpers import spec

PATHS = ("spawn", "execute", "tool_spawn", "tool_delegate")
SESSION = "conv"
FIELDS = ("tokens", "input_tokens", "output_tokens", "spawns")


@attrs.define
class Node:
    id: str
    path: str
    reports: list[tuple[int, int]]
    budget: Budget | None
    children: list[Node]

    def walk(self) -> list[Node]:
        return [self, *(n for c in self.children for n in c.walk())]


limits = st.none() | st.integers(0, 500)
budgets = st.none() | st.builds(
    Budget,
    tokens=limits,
    input_tokens=limits,
    output_tokens=limits,
    spawns=st.none() | st.integers(0, 6),
)


@st.composite
def nodes(draw: st.DrawFn, depth: int = 0) -> Node:
    children = [] if depth >= 3 else draw(st.lists(nodes(depth + 1), max_size=3 - depth))
    return Node(
        id="",
        path=draw(st.sampled_from(PATHS)),
        reports=draw(st.lists(st.tuples(st.integers(0, 150), st.integers(0, 50)), max_size=3)),
        budget=draw(budgets),
        children=children,
    )


@st.composite
def worlds(draw: st.DrawFn) -> dict[str, Any]:
    roots = draw(st.lists(nodes(), min_size=1, max_size=3))
    counter = itertools.count()
    for root in roots:
        for node in root.walk():
            node.id = f"n{next(counter)}"
    return {
        "roots": roots,
        "session_budget": draw(budgets),
        "config": SubagentConfig(
            max_children=draw(st.none() | st.integers(1, 3)),
            max_agents=draw(st.none() | st.integers(1, 8)),
            max_depth=draw(st.integers(1, 3)),
            max_concurrent_spawns=draw(st.sampled_from([1, 4])),
            spawn_timeout=None,
            execute_timeout=None,
        ),
    }


def _tool_budget(budget: Budget | None) -> dict[str, Any]:
    return {} if budget is None else {"budget": budget.to_dict()}


def _at_most(small: int | float | None, large: int | float | None) -> bool:
    return large is None or (small is not None and small <= large)


class World:
    """Runs one random tree and records what the properties are checked against."""

    def __init__(self, roots: list[Node], config: SubagentConfig) -> None:
        self.nodes = {n.id: n for root in roots for n in root.walk()}
        self.roots = roots
        self.config = config
        self.task_of: dict[str, str] = {}
        self.reported: dict[str, Usage] = {}
        self.before: dict[str, Budget] = {}
        self.started: dict[str, Budget] = {}
        self.problems: list[str] = []
        self.spawned: Counter[str] = Counter()
        self.completed: Counter[str] = Counter()
        self.live: Counter[str] = Counter()
        self.tree: Counter[str] = Counter()
        self.root_of: dict[str, str] = {}
        self.manager: SubagentManager

    def on_event(self, event: Event) -> None:
        config = self.config
        if event.type == SPAWNED:
            session = event.session_id
            root = self.root_of.get(session, session)
            self.root_of[event.task_id] = root
            self.spawned[event.task_id] += 1
            self.live[session] += 1
            self.tree[root] += 1
            if config.max_children is not None and self.live[session] > config.max_children:
                self.problems.append(f"{session} has {self.live[session]} children")
            if config.max_agents is not None and self.tree[root] > config.max_agents:
                self.problems.append(f"tree {root} has {self.tree[root]} agents")
            if AgentPath(event.agent_path).depth > config.max_depth:
                self.problems.append(f"{event.agent_path} is too deep")
        elif event.type == COMPLETED:
            self.completed[event.task_id] += 1
            self.live[event.session_id] -= 1
            self.tree[self.root_of[event.task_id]] -= 1

    async def runner(self, request: Request, ctx: RunContext) -> str:
        node = self.nodes[request.input]
        self.task_of[node.id] = ctx.task_id  # its creator may be cancelled before it knows
        self.started[node.id] = ctx.remaining_budget()
        tokens_in = tokens_out = 0
        for more_in, more_out in node.reports:
            tokens_in, tokens_out = tokens_in + more_in, tokens_out + more_out
            usage = Usage(input_tokens=tokens_in, output_tokens=tokens_out)
            self.reported[node.id] = usage
            ctx.report(usage=usage)
            await anyio.lowlevel.checkpoint()
        await self.delegate(node.children, ctx.session_id, ctx, ctx.remaining_budget)
        return "ok"

    async def delegate(
        self, children: list[Node], session: str, ctx: RunContext | None, left: Any
    ) -> None:
        tools = build_tools(self.manager, session, engine_tool_timeout=None)
        handles: list[SpawnHandle] = []
        for child in children:
            self.before[child.id] = left()
            try:
                handle = await self.create(child, session, ctx, tools)
            except SpawnRejected as exc:
                self.check_refusal(child, session, ctx, exc.reason, left())
                continue
            if handle is not None:
                handles.append(handle)
        for handle in handles:
            await handle.wait()

    async def create(
        self, child: Node, session: str, ctx: RunContext | None, tools: Toolset
    ) -> SpawnHandle | None:
        m = self.manager
        if child.path == "spawn":
            if ctx is None:
                handle = m.spawn("planned", child.id, session_id=session, budget=child.budget)
            else:
                handle = ctx.spawn("planned", child.id, budget=child.budget)
            self.task_of[child.id] = handle.task_id
            return handle
        if child.path == "execute":
            if ctx is None:
                ended = await m.execute(
                    "planned", child.id, session_id=session, budget=child.budget
                )
            else:
                ended = await ctx.execute("planned", child.id, budget=child.budget)
            self.task_of[child.id] = ended.task_id
            return None
        tool = "spawn_agent" if child.path == "tool_spawn" else "delegate_to_agent"
        args = {"agent": "planned", "input": child.id, **_tool_budget(child.budget)}
        result = await tools.call(tool, args)
        if result.is_error:
            if result.details.get("error") != "spawn_rejected":
                self.problems.append(f"{tool} failed: {result.content}")
                return None
            raise SpawnRejected(str(result.details["reason"]), result.content)
        task_id = str(result.details["task_id"])
        self.task_of[child.id] = task_id
        return m.handle(task_id) if tool == "spawn_agent" else None

    def check_refusal(
        self, child: Node, session: str, ctx: RunContext | None, reason: str, left: Budget
    ) -> None:
        """A refusal names a limit that was reached when it was made. A tool's call awaits
        around the spawn (children may end meanwhile), so only its reason is checked."""
        if child.path.startswith("tool_"):
            if reason not in ("max_children", "max_agents", "depth", "budget_exhausted"):
                self.problems.append(f"{child.id} refused for {reason}")
            return
        config = self.config
        root = self.root_of.get(session, session)
        reached = {
            "max_children": config.max_children is not None
            and self.live[session] >= config.max_children,
            "max_agents": config.max_agents is not None and self.tree[root] >= config.max_agents,
            "depth": ctx is not None and ctx.agent_path.depth + 1 > config.max_depth,
            "budget_exhausted": any(getattr(left, f) == 0 for f in FIELDS),
        }
        if not reached.get(reason, False):
            self.problems.append(f"{child.id} refused for {reason}, which was not reached")

    def check_budgets(self) -> None:
        for node in self.nodes.values():
            for child in node.children:
                self._check_carved(child)
        for root in self.roots:
            self._check_carved(root)

    def _check_carved(self, child: Node) -> None:
        start = self.started.get(child.id)
        if start is None:
            return  # refused, or cancelled before it ran
        before = self.before[child.id]
        for field in FIELDS:
            ceiling = getattr(before, field)
            if field == "spawns" and ceiling is not None:
                ceiling -= 1  # its own spawn was charged first
            asked = None if child.budget is None else getattr(child.budget, field)
            mine = getattr(start, field)
            if not (_at_most(mine, ceiling) and _at_most(mine, asked)):
                self.problems.append(f"{child.id}: {field} {mine} > left {ceiling} / {asked}")

    def check_usage(self, envelopes: dict[str, DelegateResult]) -> None:
        for node in self.nodes.values():
            envelope = envelopes.get(node.id)
            if envelope is None:
                continue
            if envelope.usage != self.reported.get(node.id, Usage()):
                self.problems.append(f"{node.id} charged {envelope.usage}")
            members = [envelopes[n.id].usage for n in node.walk() if n.id in envelopes]
            total = sum(members, Usage())
            if (
                envelope.tree_usage != total
                or self.manager.usage(envelope.task_id, tree=True) != total
            ):
                self.problems.append(f"{node.id}'s tree used {total}, not {envelope.tree_usage}")


async def play(world: World, session_budget: Budget | None) -> None:
    async with SubagentManager([spec("planned", world.runner)], config=world.config) as m:
        world.manager = m
        m.events.subscribe(world.on_event)
        session_account = None
        if session_budget is not None:
            m.open_session(SESSION, budget=session_budget)
            session_account = budgets_of(m).session_budget(SESSION)
        with anyio.fail_after(30):
            await world.delegate(world.roots, SESSION, None, lambda: remaining(session_account))
        envelopes = {n: m.result(t) for n, t in world.task_of.items()}
        ended = {n: e for n, e in envelopes.items() if e is not None}
        assert len(ended) == len(envelopes), "a child of an ended tree is still running"
        world.check_budgets()
        world.check_usage(ended)
        if session_account is not None:
            total = sum((e.usage for e in ended.values()), Usage())
            assert session_account.tree_usage() == total
    assert all(n == 1 for n in world.completed.values()), world.completed
    assert set(world.completed) == set(world.spawned)
    assert not world.problems, world.problems


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(world=worlds())
def test_random_trees_keep_every_budget_and_limit(world: dict[str, Any], backend: str) -> None:
    played = World(world["roots"], world["config"])
    anyio.run(play, played, world["session_budget"], backend=backend)
