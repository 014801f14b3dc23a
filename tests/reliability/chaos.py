"""The chaos driver: many spawns with random faults under random interference, then checks.

Every spawn gets a :class:`Plan`, drawn from a seeded RNG before it is spawned: its fault
(what its runner does), a variant of that fault, its session and whether it is spawned or
delegated with ``execute``. While the spawns run, "monkey" tasks cancel random tasks, close
sessions (named root sessions and the sessions of running nested parents), resize the
limiter and drain mailboxes, and waiter tasks wait for random tasks with tiny timeouts.
:meth:`Chaos.check` then verifies the invariants listed in ``design/reliability.md``.

The waiter is pluggable (``Chaos(waiter=...)``): the core suite waits with
:meth:`SubagentManager.wait_result`; a tool-level suite can pass a coroutine that calls
``wait_agent`` and maps its answer back to the envelope. Contract of a waiter: return the
envelope if the task had ended by the time it returns, else ``None``.

Reproduce a failure with ``SUBAGENTS_CHAOS_SEED=<seed>`` (the seed is in every assertion
message). The interleaving of tasks is not fully determined by the seed (trio randomises
its run queue), but the plan of every spawn is.
"""

from __future__ import annotations

import os
import random
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from time import perf_counter
from typing import Final

import anyio
import anyio.lowlevel
import attrs

from subagents import (
    AgentSpec,
    DelegateResult,
    Event,
    ManagerStatistics,
    Request,
    Result,
    RetryPolicy,
    RunContext,
    SpawnHandle,
    SpawnRejected,
    Status,
    SubagentConfig,
    SubagentManager,
    TransientError,
    Usage,
)
from subagents._events import COMPLETED, SPAWNED, STARTED
from subagents._handle import record_of

# The spawned plan whose slot the current task runs on (executed children share it).
_SLOT_PLAN: ContextVar[object | None] = ContextVar("chaos_slot_plan", default=None)

DEFAULT_SEED: Final = 20261130
SEED: Final = int(os.environ.get("SUBAGENTS_CHAOS_SEED", DEFAULT_SEED))
SOAK: Final = int(os.environ.get("SUBAGENTS_SOAK", "0") or 0)

Waiter = Callable[[SubagentManager, str, float], Awaitable[DelegateResult | None]]
"""``await waiter(manager, task_id, timeout)``: the envelope, or ``None`` on timeout."""


async def wait_with_manager(
    manager: SubagentManager, task_id: str, timeout: float
) -> DelegateResult | None:
    """The core waiter: :meth:`SubagentManager.wait_result` (collects the envelope)."""
    return await manager.wait_result(task_id, timeout=timeout)


# What a runner does. Weights are relative; leaves are what nested parents spawn.
FAULT_WEIGHTS: Final = {
    "ok": 30,
    "raise": 10,
    "hang": 8,
    "wrong_type": 8,
    "partial_hang": 8,
    "nested": 8,
    "cancelled": 10,
    "session_closed": 6,
    "flaky": 6,
}
LEAF_FAULTS: Final = ("ok", "ok", "raise", "hang", "wrong_type", "partial_hang", "flaky")
BASE_STATUS: Final = {
    "ok": Status.COMPLETED,
    "nested": Status.COMPLETED,
    "raise": Status.ERROR,
    "wrong_type": Status.ERROR,
    "hang": Status.TIMEOUT,
    "partial_hang": Status.TIMEOUT,
    "cancelled": Status.CANCELLED,
    "session_closed": Status.CANCELLED,
    "flaky": Status.COMPLETED,  # variant % 3 == 0: always transient, so ERROR
}
WRONG_TYPES: Final[tuple[object, ...]] = (42, None, b"bytes", {"output": "a dict"}, ["x"])

# The reasons the manager writes into a cancelled envelope's error.
BY_REQUEST: Final = "cancelled by request"
SESSION_CLOSED: Final = "its session was closed"
PARENT_ENDED: Final = "its parent agent ended"
CALLER_CANCELLED: Final = "the caller was cancelled"


@attrs.define(eq=False)
class Plan:
    """One spawn (or execute) of the run, and everything observed about it."""

    index: int
    fault: str
    variant: int
    mode: str  # "spawn" or "execute"
    slot: int  # index of the root session it goes to; -1: the doomed session
    parent: Plan | None = None
    children: list[Plan] = attrs.Factory(list)
    session: str = ""
    attempted: bool = False
    rejected: bool = False
    task_id: str | None = None
    handle: SpawnHandle | None = None
    ran: bool = False
    must_cancel: bool = False
    cancel_reasons: set[str] = attrs.Factory(set)
    spawned_events: int = 0
    started_events: int = 0
    seqs: list[int] = attrs.Factory(list)  # bus sequence numbers of its events, in order
    completed: list[Event] = attrs.Factory(list)
    mailbox_takes: list[DelegateResult] = attrs.Factory(list)
    waited: list[DelegateResult] = attrs.Factory(list)
    returned: DelegateResult | None = None  # what execute() returned

    @property
    def name(self) -> str:
        return f"p{self.index}"

    @property
    def input(self) -> str:
        return str(self.index)

    @property
    def agent(self) -> str:
        return "chaos_retry" if self.fault == "flaky" else "chaos"

    @property
    def base_status(self) -> Status:
        if self.fault == "flaky" and self.variant % 3 == 0:
            return Status.ERROR
        return BASE_STATUS[self.fault]

    def allowed(self) -> set[Status]:
        if self.must_cancel:
            return {Status.CANCELLED}
        allowed = {self.base_status}
        if self.cancel_reasons:
            allowed.add(Status.CANCELLED)
        return allowed

    def describe(self) -> str:
        where = f"child of p{self.parent.index}" if self.parent else "top"
        return (
            f"p{self.index}[{self.fault}/{self.variant} {self.mode} {where} "
            f"session={self.session} task={self.task_id}]"
        )


@attrs.frozen(kw_only=True)
class Summary:
    """What a chaos run did, for the report and the soak log."""

    seed: int
    backend: str
    spawns: int
    seconds: float
    statuses: dict[str, int]
    by_fault: dict[str, dict[str, int]]
    high_water: int
    max_limit: int
    operations: dict[str, int]
    max_stall: float

    def render(self) -> str:
        per = self.seconds / max(self.spawns, 1) * 1e6
        lines = [
            f"chaos seed={self.seed} backend={self.backend}: {self.spawns} spawns in "
            f"{self.seconds:.2f} s ({per:.0f} us/spawn)",
            f"  statuses: {dict(sorted(self.statuses.items()))}",
            f"  limiter: high water {self.high_water} <= max limit {self.max_limit}; "
            f"longest event-loop stall {self.max_stall * 1000:.0f} ms",
            f"  interference: {dict(sorted(self.operations.items()))}",
        ]
        for fault, statuses in sorted(self.by_fault.items()):
            lines.append(f"  {fault:>14}: {dict(sorted(statuses.items()))}")
        return "\n".join(lines)


class Chaos:
    """A chaos fan-out run on the current event loop; ``await run()`` then ``check()``.

    Args:
        spawns: top-level spawns (nested parents add children on top).
        seed: the RNG seed for plans and interference.
        max_limit: the largest concurrency limit the resizer sets.
        watchdog: seconds before a hanging runner times out.
        root_sessions: how many root sessions spawns are spread over (each replaced by a new
            generation once closed).
        waiters: how many concurrent waiter tasks run.
        waiter: how waits are done (see the module docstring).
        exact_waiter: the waiter guarantees ``None`` only while the task has not ended.
        budget: seconds the whole run may take before it counts as a hang.
        max_queue: back-pressure: the spawner pauses while more spawns than this queue.
        mailbox_capacity, mailbox_ttl: the session mailboxes' settings.
        nested_waits: nested parents block until each spawned child ends (holding their
            slot meanwhile). Off by default: without slot lending this can deadlock at
            low limits; turn it on to test slot lending.
    """

    def __init__(
        self,
        *,
        spawns: int,
        seed: int = SEED,
        max_limit: int = 12,
        watchdog: float = 0.03,
        root_sessions: int = 6,
        waiters: int = 3,
        waiter: Waiter = wait_with_manager,
        exact_waiter: bool = True,
        budget: float = 60.0,
        max_queue: int = 150,
        mailbox_capacity: int = 64,
        mailbox_ttl: float | None = None,
        nested_waits: bool = False,
    ) -> None:
        self.spawns = spawns
        self.seed = seed
        self.max_limit = max_limit
        self.watchdog = watchdog
        self.waiters = waiters
        self.waiter = waiter
        self.exact_waiter = exact_waiter
        self.budget = budget
        self.max_queue = max_queue
        self.mailbox_capacity = mailbox_capacity
        self.mailbox_ttl = mailbox_ttl
        self.nested_waits = nested_waits
        self.rng = random.Random(seed)
        self.plans: list[Plan] = []
        self.by_name: dict[str, Plan] = {}
        self.by_task: dict[str, Plan] = {}
        self.root_names = [f"s{k}" for k in range(root_sessions)]
        self.generations = [0] * root_sessions
        self.doomed = 0
        self.sessions_used: dict[str, list[Plan]] = {}
        self.closed: set[str] = set()
        self.to_cancel: deque[Plan] = deque()
        self.to_close: deque[str] = deque()
        self.recent: deque[Plan] = deque(maxlen=256)
        self.inflight = 0
        self.inflight_high = 0
        self.limits_set = [0]
        self.problems: list[str] = []
        self.ops: Counter[str] = Counter()
        self.manager: SubagentManager | None = None
        self.final_stats: ManagerStatistics | None = None
        self.seconds = 0.0
        self.backend = ""
        self.max_stall = 0.0
        self.progressed = anyio.Event()
        """Set by every event of the manager (renewed by whoever waits on it)."""

    # ------------------------------------------------------------------ plans

    def _fault(self, rng: random.Random) -> str:
        faults = list(FAULT_WEIGHTS)
        return rng.choices(faults, weights=[FAULT_WEIGHTS[f] for f in faults])[0]

    def _new_plan(self, rng: random.Random, fault: str, parent: Plan | None) -> Plan:
        mode = "execute" if rng.random() < (0.25 if parent else 0.03) else "spawn"
        slot = -1 if fault == "session_closed" or rng.random() < 0.08 else 0
        if slot == 0:
            slot = rng.randrange(len(self.root_names))
        plan = Plan(
            index=len(self.plans),
            fault=fault,
            variant=rng.randrange(6),
            mode=mode,
            slot=slot,
            parent=parent,
        )
        self.plans.append(plan)
        self.by_name[plan.name] = plan
        if fault == "nested":
            for _ in range(rng.randint(1, 3)):
                child = self._new_plan(rng, rng.choice(LEAF_FAULTS), plan)
                # A child may be cancelled when its parent ends (and, run with execute(),
                # when its caller is cancelled); otherwise its fault decides.
                child.cancel_reasons.add(PARENT_ENDED)
                if child.mode == "execute":
                    child.cancel_reasons.add(CALLER_CANCELLED)
                plan.children.append(child)
        return plan

    def _timeout(self, plan: Plan) -> float | None:
        if plan.fault in ("hang", "partial_hang"):
            return self.watchdog
        if plan.fault in ("ok", "raise", "wrong_type", "flaky"):
            # A real watchdog that must never fire: as long as the whole run may take, since
            # a loaded machine stalls the loop for seconds (full GC of a big heap).
            return self.budget
        return None  # cancelled / session_closed / nested: ended by the run itself

    def _session(self, plan: Plan) -> str:
        """The live session name for a top-level plan (a closed one is replaced)."""
        manager = self.manager
        assert manager is not None
        if plan.slot < 0:
            name = f"doom{self.doomed}"
            if manager.session_closed(name):
                self.doomed += 1
                name = f"doom{self.doomed}"
            return name
        name = f"{self.root_names[plan.slot]}.{self.generations[plan.slot]}"
        if manager.session_closed(name):
            self.generations[plan.slot] += 1
            name = f"{self.root_names[plan.slot]}.{self.generations[plan.slot]}"
        return name

    def _record_session(self, plan: Plan) -> None:
        self.sessions_used.setdefault(plan.session, []).append(plan)

    # ------------------------------------------------------------------ events

    def _on_event(self, event: Event) -> None:
        self.progressed.set()
        if event.type == SPAWNED:
            plan = self.by_name.get(event.agent_path.rsplit("/", 1)[-1])
            if plan is None:
                self.problems.append(f"spawned event for an unplanned path {event.agent_path}")
                return
            plan.spawned_events += 1
            plan.seqs.append(event.seq)
            plan.task_id = event.task_id
            assert self.manager is not None
            plan.handle = self.manager.handle(event.task_id)
            self.by_task[event.task_id] = plan
            return
        plan = self.by_task.get(event.task_id)
        if plan is None:
            self.problems.append(f"{event.type} event for an unknown task {event.task_id}")
        elif event.type == STARTED:
            plan.started_events += 1
            plan.seqs.append(event.seq)
        elif event.type == COMPLETED:
            plan.completed.append(event)
            plan.seqs.append(event.seq)

    # ------------------------------------------------------------------ the runner

    async def _runner(self, request: Request, ctx: RunContext) -> Result | str:
        plan = self.plans[int(request.input)]
        plan.ran = True
        in_slot = plan.mode == "spawn"
        if in_slot:
            self.inflight += 1
            limit = ctx.manager.max_concurrent_spawns
            # Admission is at the first attempt; a retry runs in the slot it already holds.
            if self.inflight > limit and ctx.attempt == 1:
                self.problems.append(
                    f"{plan.describe()} started with {self.inflight} spawned runners in "
                    f"flight above the limit {limit}"
                )
            borrowed = ctx.manager.statistics().borrowed
            self.inflight_high = max(self.inflight_high, self.inflight - borrowed)
        token = _SLOT_PLAN.set(plan) if in_slot else None
        try:
            return await self._behave(plan, ctx)
        finally:
            if token is not None:
                _SLOT_PLAN.reset(token)
            if in_slot:
                self.inflight -= 1

    async def _wait_lending(
        self, ctx: RunContext, task_id: str, timeout: float | None
    ) -> DelegateResult | None:
        """ctx.wait lends the slot of the spawned runner this task runs on (slot lending):
        that runner is not in flight while it waits, and holds a slot again afterwards."""
        owner = _SLOT_PLAN.get()
        if owner is not None:
            self.inflight -= 1
        try:
            return await ctx.wait(task_id, timeout=timeout)
        finally:
            if owner is not None:
                # Not checked against the current limit: the slot was granted when the
                # waiter was woken, and a resize may have lowered the limit since (running
                # children are never preempted). The run-wide peak is checked at the end.
                # A wait that timed out with no slot free resumes on a borrowed one, which
                # the manager counts beyond the limit: the limit bounds the rest.
                self.inflight += 1
                borrowed = ctx.manager.statistics().borrowed
                self.inflight_high = max(self.inflight_high, self.inflight - borrowed)

    async def _behave(self, plan: Plan, ctx: RunContext) -> Result | str:
        fault, v, i = plan.fault, plan.variant, plan.index
        if fault == "ok":
            if v % 3 != 2:
                await anyio.lowlevel.checkpoint()
            if v % 3 == 1:
                usage = Usage(input_tokens=i, output_tokens=1)
                return Result(output=f"ok {i}", usage=usage, iterations=2)
            return f"ok {i}"
        if fault == "raise":
            if v % 2:
                await anyio.lowlevel.checkpoint()
            raise ValueError(f"boom {i}")
        if fault == "hang":
            await anyio.sleep_forever()
        if fault == "wrong_type":
            if v % 2:
                await anyio.lowlevel.checkpoint()
            return WRONG_TYPES[v % len(WRONG_TYPES)]  # type: ignore[return-value]
        if fault == "partial_hang":
            ctx.report(output=f"partial {i}", iterations=1)
            await anyio.sleep_forever()
        if fault == "nested":
            return await self._nested(plan, ctx)
        if fault == "cancelled":
            if v % 3 == 0:
                self.to_cancel.append(plan)
                await anyio.sleep_forever()
            requested = ctx.manager.cancel(ctx.task_id)
            if not requested and not plan.cancel_reasons:
                self.problems.append(f"{plan.describe()}: cancel of itself returned False")
            plan.cancel_reasons.add(BY_REQUEST)
            plan.must_cancel = True
            self.ops["self_cancel"] += 1
            if v % 3 == 1:
                await anyio.sleep_forever()
            return f"too late {i}"  # no checkpoint since the cancel: still cancelled
        if fault == "session_closed":
            self.to_close.append(plan.session)
            await anyio.sleep_forever()
        if fault == "flaky":  # transient failures retried under the agent's RetryPolicy
            if v % 3 == 0 or ctx.attempt < 2 + v % 2:
                raise TransientError(f"flaky {i} attempt {ctx.attempt}")
            return f"flaky {i}"
        raise AssertionError(f"unknown fault {fault}")

    async def _nested(self, plan: Plan, ctx: RunContext) -> str:
        first: Plan | None = None
        for child in plan.children:
            child.session = ctx.session_id
            child.attempted = True
            self._record_session(child)
            closed_before = ctx.session_id in self.closed
            try:
                if child.mode == "spawn":
                    ctx.spawn(
                        child.agent, child.input, name=child.name, timeout=self._timeout(child)
                    )
                    first = first or child
                else:
                    child.returned = await ctx.execute(
                        child.agent, child.input, name=child.name, timeout=self._timeout(child)
                    )
            except SpawnRejected:
                child.rejected = True
                if not closed_before:
                    self.problems.append(f"{child.describe()}: rejected but the session is open")
                continue
            if closed_before:
                self.problems.append(
                    f"{child.describe()}: accepted into session {ctx.session_id}, "
                    "which had been closed"
                )
        if self.nested_waits:
            for child in plan.children:
                if child.mode == "spawn" and child.task_id is not None:
                    env = await self._wait_lending(ctx, child.task_id, None)
                    if env is not None:
                        child.waited.append(env)
        elif first is not None and plan.variant % 2 and first.task_id is not None:
            env = await self._wait_lending(ctx, first.task_id, 0.001)
            if env is not None:
                first.waited.append(env)
        return f"nested {plan.index}"

    # ------------------------------------------------------------------ interference

    def _cancel(self, plan: Plan, kind: str) -> None:
        assert self.manager is not None
        assert plan.task_id is not None
        handle = self.manager.handle(plan.task_id)
        unsettled = handle.result is None
        requested = self.manager.cancel(plan.task_id)
        self.ops[kind] += 1
        if requested and not unsettled:
            self.problems.append(f"{plan.describe()}: cancel() returned True after it ended")
        # False for an unsettled child means its runner already returned (its outcome is
        # fixed, its subtree settling) or a cancel was already requested (marked then).
        if requested:
            plan.must_cancel = True
            plan.cancel_reasons.add(BY_REQUEST)

    async def _close(self, session: str, kind: str) -> None:
        manager = self.manager
        assert manager is not None
        self.closed.add(session)
        for plan in self.sessions_used.get(session, ()):
            handle = plan.handle
            # A child whose runner already returned keeps the outcome it had (it is only
            # waiting for its own children to settle): the close comes too late for it.
            # private: no public way to tell a child that is settling its children from
            # one whose runner runs (both are "running"; the runner may be retried).
            if handle is not None and handle.result is None and not record_of(handle).ending:
                plan.must_cancel = True
                plan.cancel_reasons.add(SESSION_CLOSED)
        self.ops[kind] += 1
        # Runs synchronously up to its first await: the snapshot above is exact.
        await manager.close_session(session)
        mailbox = manager.mailbox(session)
        if not mailbox.closed or len(mailbox):
            self.problems.append(f"session {session}: mailbox still open after close_session")

    def _take(self, env: DelegateResult, how: str) -> None:
        plan = self.by_task.get(env.task_id)
        if plan is None:
            self.problems.append(f"{how} returned an envelope of an unknown task {env.task_id}")
        else:
            plan.mailbox_takes.append(env)

    def _pick(self, rng: random.Random) -> Plan | None:
        candidates = [p for p in self.recent if p.task_id is not None]
        return rng.choice(candidates) if candidates else None

    async def _monkey(self, rng: random.Random) -> None:
        manager = self.manager
        assert manager is not None
        while True:
            while self.to_cancel:
                self._cancel(self.to_cancel.popleft(), "cancel_announced")
            while self.to_close:
                session = self.to_close.popleft()
                if session not in self.closed:
                    await self._close(session, "close_doomed")
            roll = rng.random()
            if roll < 0.05:
                plan = self._pick(rng)
                if plan is not None:
                    self._cancel(plan, "cancel_random")
            elif roll < 0.10:
                limit = rng.choice([1, 2, 3, 4, 6, 8, self.max_limit])
                manager.set_max_concurrent_spawns(limit)
                self.limits_set.append(limit)
                self.ops["resize"] += 1
            elif roll < 0.1015:
                slot = rng.randrange(len(self.root_names))
                session = f"{self.root_names[slot]}.{self.generations[slot]}"
                if session in self.sessions_used and session not in self.closed:
                    await self._close(session, "close_random")
            elif roll < 0.115:
                nested = [
                    p
                    for p in self.recent
                    if p.fault == "nested" and p.handle is not None and p.handle.state == "running"
                ]
                if nested:
                    await self._close(rng.choice(nested).task_id or "", "close_nested")
            elif roll < 0.16:
                session = rng.choice(list(self.sessions_used) or ["s0.0"])
                for env in manager.mailbox(session).drain_all():
                    self._take(env, "drain_all")
                self.ops["drain_all"] += 1
            await anyio.sleep(rng.choice((0, 0.0005, 0.001)))

    async def _stall_monitor(self) -> None:
        """Records the longest the event loop took to wake a 10 ms sleeper, beyond 10 ms."""
        while True:
            before = perf_counter()
            await anyio.sleep(0.01)
            self.max_stall = max(self.max_stall, perf_counter() - before - 0.01)

    async def _waiter_loop(self, rng: random.Random) -> None:
        manager = self.manager
        assert manager is not None
        while True:
            plan = self._pick(rng)
            if plan is None or plan.task_id is None:
                await self._next_event()  # a spawned event gives a plan its task id
                continue
            timeout = rng.choice((0.0, 0.0001, 0.001, 0.003))
            roll = rng.random()
            if roll < 0.6:
                env = await self.waiter(manager, plan.task_id, timeout)
                if env is None:
                    self.ops["wait_timed_out"] += 1
                    if self.exact_waiter and manager.result(plan.task_id) is not None:
                        self.problems.append(
                            f"{plan.describe()}: the waiter returned None although the "
                            "envelope existed when it returned"
                        )
                else:
                    self.ops["wait_returned"] += 1
                    plan.waited.append(env)
            else:
                mailbox = manager.mailbox(plan.session)
                if roll < 0.85:
                    env = await mailbox.wait(plan.task_id, timeout=timeout)
                else:  # a waiter cancelled while blocked must leave nothing behind
                    env = None
                    with anyio.move_on_after(timeout):
                        env = await mailbox.wait(plan.task_id)
                self.ops["mailbox_wait"] += 1
                if env is not None:
                    self._take(env, "Mailbox.wait")
            await anyio.sleep(rng.choice((0, 0.0005)))

    # ------------------------------------------------------------------ the run

    async def _execute(self, plan: Plan) -> None:
        manager = self.manager
        assert manager is not None
        plan.session = self._session(plan)
        plan.attempted = True
        self._record_session(plan)
        plan.returned = await manager.execute(
            plan.agent,
            plan.input,
            session_id=plan.session,
            name=plan.name,
            timeout=self._timeout(plan),
        )

    async def _spawn_all(self, work: anyio.abc.TaskGroup) -> None:
        manager = self.manager
        assert manager is not None
        rng = self.rng
        for n in range(self.spawns):
            plan = self._new_plan(rng, self._fault(rng), None)
            if plan.mode == "execute":
                work.start_soon(self._execute, plan)
            else:
                plan.session = self._session(plan)
                plan.attempted = True
                self._record_session(plan)
                handle = manager.spawn(
                    plan.agent,
                    plan.input,
                    session_id=plan.session,
                    name=plan.name,
                    timeout=self._timeout(plan),
                )
                if handle is not plan.handle:
                    self.problems.append(f"{plan.describe()}: spawn returned another handle")
                self.recent.append(plan)
            if n % 16 == 15:
                await anyio.lowlevel.checkpoint()
            # Back-pressure: a queued spawn leaves the queue as it starts or ends, each
            # with an event, so the count is looked at again after each event.
            while manager.statistics().queued > self.max_queue:
                await self._next_event()

    async def _next_event(self) -> None:
        """Return after the manager's next event (published after this call)."""
        if self.progressed.is_set():
            self.progressed = anyio.Event()
        await self.progressed.wait()

    async def _settle(self) -> None:
        """Wait until every spawn so far has its envelope (nested ones appear late)."""
        seen = 0
        while True:
            handles = [p.handle for p in self.plans if p.handle is not None]
            for handle in handles:
                await handle.wait()
            if len(handles) == seen:
                return
            seen = len(handles)

    async def run(self) -> Summary:
        """Run the scenario; raises AssertionError (with the seed) if it does not finish."""
        self.backend = _backend_name()
        config = SubagentConfig(
            max_concurrent_spawns=self.max_limit,
            settle_timeout=5.0,
            mailbox_capacity=self.mailbox_capacity,
            mailbox_ttl=self.mailbox_ttl,
        )
        self.limits_set = [self.max_limit]
        spec = AgentSpec(
            name="chaos", description="a runner with injected faults", runner=self._runner
        )
        retry = RetryPolicy(attempts=3, initial=0.001, maximum=0.002, jitter=0.0)
        flaky = AgentSpec(
            name="chaos_retry",
            description="retries transient faults",
            runner=self._runner,
            retry=retry,
        )
        started = perf_counter()
        async with SubagentManager([spec, flaky], config=config) as manager:
            self.manager = manager
            unsubscribe = manager.events.subscribe(self._on_event)
            try:
                with anyio.fail_after(self.budget):
                    async with anyio.create_task_group() as monkeys:
                        monkeys.start_soon(self._monkey, random.Random(self.seed + 1))
                        monkeys.start_soon(self._stall_monitor)
                        for k in range(self.waiters):
                            monkeys.start_soon(self._waiter_loop, random.Random(self.seed + 2 + k))
                        async with anyio.create_task_group() as work:
                            await self._spawn_all(work)
                        await self._settle()
                        monkeys.cancel_scope.cancel()
                    await anyio.wait_all_tasks_blocked()
                    self.final_stats = manager.statistics()
                    self._check_mailboxes()
            except TimeoutError:
                unsettled = [p.describe() for p in self.plans if p.handle and not p.handle.result]
                raise AssertionError(
                    f"seed={self.seed}: the chaos run did not finish within {self.budget} s "
                    f"(something hangs); {len(unsettled)} unsettled, e.g. {unsettled[:5]}"
                ) from None
            finally:
                unsubscribe()
        self.seconds = perf_counter() - started
        return self.summary()

    def _check_mailboxes(self) -> None:
        manager = self.manager
        assert manager is not None
        for session, plans in self.sessions_used.items():
            if manager.session_closed(session):
                continue
            mailbox = manager.mailbox(session)
            stats = mailbox.statistics()
            if stats.task_subscribers:
                self.problems.append(
                    f"session {session}: {stats.task_subscribers} waiters left registered"
                )
            for plan in plans:
                if plan.task_id is None:
                    continue
                entry = mailbox.peek(plan.task_id)
                if entry is None:
                    continue
                if entry is not manager.result(plan.task_id):
                    self.problems.append(f"{plan.describe()}: mailbox holds another envelope")
                if plan.mailbox_takes or (plan.handle is not None and plan.handle.collected):
                    self.problems.append(f"{plan.describe()}: consumed yet still in the mailbox")
                if plan.mode == "execute":
                    self.problems.append(f"{plan.describe()}: an execute() result in the mailbox")

    # ------------------------------------------------------------------ invariants

    def summary(self) -> Summary:
        statuses: Counter[str] = Counter()
        by_fault: dict[str, Counter[str]] = {}
        for plan in self.plans:
            if plan.handle is None or plan.handle.result is None:
                continue
            status = plan.handle.result.status.value
            statuses[status] += 1
            by_fault.setdefault(plan.fault, Counter())[status] += 1
        stats = self.final_stats
        return Summary(
            seed=self.seed,
            backend=self.backend,
            spawns=sum(statuses.values()),
            seconds=self.seconds,
            statuses=dict(statuses),
            by_fault={k: dict(v) for k, v in by_fault.items()},
            high_water=stats.high_water if stats is not None else -1,
            max_limit=max(self.limits_set),
            operations=dict(self.ops),
            max_stall=self.max_stall,
        )

    def check(self) -> list[str]:
        """Every invariant violation found, as sentences (empty when all hold)."""
        problems = list(self.problems)
        manager = self.manager
        assert manager is not None
        spawned = 0
        for plan in self.plans:
            problems.extend(self._check_plan(plan))
            if plan.task_id is not None:
                spawned += 1
        stats = self.final_stats
        max_limit = max(self.limits_set)
        if stats is None:
            problems.append("no final statistics (the run did not finish)")
        else:
            for field in ("running", "queued", "workers"):
                if getattr(stats, field) != 0:
                    problems.append(f"after the run statistics().{field} = {getattr(stats, field)}")
            if stats.spawned != spawned or stats.settled != spawned:
                problems.append(f"statistics {stats} but {spawned} spawns were observed")
            if stats.high_water > max_limit:
                problems.append(
                    f"high water {stats.high_water} above every limit set ({max_limit})"
                )
        if self.inflight_high > max_limit:
            problems.append(f"runners in flight peaked at {self.inflight_high} > {max_limit}")
        return problems

    def _check_plan(self, plan: Plan) -> list[str]:
        out: list[str] = []
        what = plan.describe()
        if plan.task_id is None:
            if plan.attempted and not plan.rejected:
                out.append(f"{what}: attempted but never spawned")
            if not plan.attempted and plan.parent is None:
                out.append(f"{what}: never attempted")
            return out
        assert self.manager is not None
        env = self.manager.result(plan.task_id)
        if plan.spawned_events != 1:
            out.append(f"{what}: {plan.spawned_events} spawned events")
        if env is None:
            return [*out, f"{what}: no envelope"]
        if env.task_id != plan.task_id or plan.handle is None or plan.handle.result is not env:
            out.append(f"{what}: the manager's record and the handle disagree")
        if len(plan.completed) != 1:
            out.append(f"{what}: {len(plan.completed)} subagent.completed events (want 1)")
        for event in plan.completed:
            if event.data.get("status") != env.status.value:
                out.append(f"{what}: completed event says {event.data.get('status')}")
            if event.session_id != plan.session:
                out.append(f"{what}: completed event for session {event.session_id}")
        last_is_completed = bool(plan.completed) and plan.completed[-1].seq == plan.seqs[-1]
        if plan.seqs != sorted(plan.seqs) or not last_is_completed:
            out.append(f"{what}: events out of order (spawned < started < completed): {plan.seqs}")
        if plan.started_events > 1:
            out.append(f"{what}: {plan.started_events} started events")
        if plan.ran and plan.started_events != 1:
            out.append(f"{what}: ran without exactly one started event")
        if not plan.ran and env.status is not Status.CANCELLED:
            out.append(f"{what}: never ran but ended {env.status.value}")
        for got in (*plan.waited, *plan.mailbox_takes):
            if got is not env:
                out.append(f"{what}: a wait returned a different envelope")
        if len(plan.mailbox_takes) > 1:
            out.append(f"{what}: taken from the mailbox {len(plan.mailbox_takes)} times")
        if plan.returned is not None and plan.returned is not env:
            out.append(f"{what}: execute() returned a different envelope")
        allowed = plan.allowed()
        if env.status not in allowed:
            out.append(
                f"{what}: ended {env.status.value} ({env.error!r}), allowed "
                f"{sorted(s.value for s in allowed)}"
            )
            return out
        if env.status is Status.CANCELLED:
            if env.error_type != "cancelled" or not any(
                r in env.error for r in plan.cancel_reasons
            ):
                out.append(f"{what}: cancelled for {env.error!r}, not {plan.cancel_reasons}")
            return out
        i, v = plan.index, plan.variant
        if plan.fault == "ok":
            if env.output != f"ok {i}" or (v % 3 == 1 and env.usage.input_tokens != i):
                out.append(f"{what}: completed with output {env.output!r}, usage {env.usage}")
        elif plan.fault == "nested":
            if env.output != f"nested {i}":
                out.append(f"{what}: completed with output {env.output!r}")
        elif plan.fault == "raise":
            if env.error_type != "ValueError" or f"boom {i}" not in env.error:
                out.append(f"{what}: error {env.error_type} {env.error!r}")
        elif plan.fault == "wrong_type":
            if not env.error_type.endswith("RunnerReturnError"):
                out.append(f"{what}: error {env.error_type} {env.error!r}")
        elif plan.fault == "flaky":
            if v % 3 == 0 and (not env.error_type.endswith("TransientError") or env.attempts != 3):
                out.append(f"{what}: gave up as {env.error_type} after {env.attempts} attempts")
            if v % 3 and (env.output != f"flaky {i}" or env.attempts != 2 + v % 2):
                out.append(f"{what}: completed {env.output!r} after {env.attempts} attempts")
        elif plan.fault in ("hang", "partial_hang"):
            want = f"partial {i}" if plan.fault == "partial_hang" else ""
            if env.error_type != "timeout" or env.output != want:
                out.append(f"{what}: timeout {env.error_type} with output {env.output!r}")
        try:
            env.to_json()
        except Exception as exc:  # pragma: no cover - reported as a problem
            out.append(f"{what}: to_json() failed: {exc!r}")
        return out

    def assert_ok(self) -> None:
        """Raise AssertionError naming the seed and the first violations."""
        problems = self.check()
        if problems:
            shown = "\n  ".join(problems[:25])
            raise AssertionError(
                f"seed={self.seed} (rerun with SUBAGENTS_CHAOS_SEED={self.seed}): "
                f"{len(problems)} invariant violations:\n  {shown}"
            )


def _backend_name() -> str:
    import sniffio

    return sniffio.current_async_library()


def scaled(default: int) -> int:
    """``SUBAGENTS_SOAK`` when set (the long soak), else ``default``."""
    return SOAK if SOAK > 0 else default


__all__ = ["SEED", "SOAK", "Chaos", "Plan", "Summary", "Waiter", "scaled", "wait_with_manager"]
