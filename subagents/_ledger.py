"""The ledger: fan-out limits and budgets checked as a child is spawned, its budget carved
from what its ancestors have left, and the subtree stopped whose budget its usage exceeds.

Every spawn path (``spawn``, ``execute``, the tools, a runner's ``ctx.spawn``) goes
through :meth:`Ledger.admit` and :meth:`Ledger.opened`, beside the depth limit; usage
reaches the accounts through ``ctx.report`` and :func:`charge_result`. See
design/budgets.md.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import Final, Protocol

import anyio
import attrs

from ._account import Account, remaining
from ._budget import Budget
from ._envelope import Status, Usage
from ._errors import ConfigError, SpawnRejected
from ._json import JSONValue
from ._record import QUEUED, ChildRecord
from ._sessions import Sessions
from ._spec import AgentSpec, Result, SpawnOptions
from ._watchdog import Watchdog

__all__ = [
    "BUDGET_EXCEEDED",
    "Ledger",
    "budget_outcome",
    "charge_result",
    "tree_usage",
    "usage_of",
    "with_budget",
]

logger = logging.getLogger("subagents")

BUDGET_EXCEEDED: Final = "BudgetExceeded"
"""The ``error_type`` of the envelope of a child stopped by a budget."""


class Ender(Protocol):
    """How the ledger ends children: the child runner's."""

    def cancel(self, record: ChildRecord, reason: str) -> bool:
        """Cancel ``record`` (False if it has ended, or is ending already)."""

    def time_out(self, record: ChildRecord) -> bool:
        """End ``record``, still in the queue, ``timeout`` (False if it is not queued)."""


class _Alarm:
    """The end of a session's seconds budget, armed on the watchdog, which calls
    :meth:`cancel` then. Never raises: it runs in the watchdog's task."""

    __slots__ = ("_ring",)

    def __init__(self, ring: Callable[[], None]) -> None:
        self._ring = ring

    def cancel(self) -> None:
        try:
            self._ring()
        except Exception:
            logger.exception("ending the queued children of a session out of time failed")


class Ledger:
    """The budgets of root sessions, the fan-out limits, and stopping over-budget nodes.

    Args:
        sessions: the records, for the live children of a session and the size of a tree.
        max_children: unfinished children one parent (a session) may have; ``None``: any.
        max_agents: unfinished agents one tree (a root session's) may have; ``None``: any.
    """

    def __init__(
        self, sessions: Sessions, max_children: int | None, max_agents: int | None
    ) -> None:
        self._sessions = sessions
        self._max_children = max_children
        self._max_agents = max_agents
        self._sessions_budgets: dict[str, Account] = {}
        self._alarms: dict[str, _Alarm] = {}  # sessions' seconds budgets on the watchdog
        self._ender: Ender | None = None
        self._watchdog: Watchdog | None = None

    def attach(self, ender: Ender, watchdog: Watchdog) -> None:
        """What ends children (the child runner) and keeps time (the watchdog), given as
        the manager is made (they are made after the spawner that owns this ledger)."""
        self._ender = ender
        self._watchdog = watchdog

    def _cancel(self, record: ChildRecord, reason: str) -> bool:
        assert self._ender is not None, "attach() first"
        return self._ender.cancel(record, reason)

    # ------------------------------------------------------------------ spawning

    def admit(
        self, session_id: str, parent: ChildRecord | None, spec: AgentSpec, options: SpawnOptions
    ) -> Budget | None:
        """Check that ``session_id`` may take one more child: its fan-out, its tree's size
        and every budget above it. Returns the budget the spawn asks for (the agent's and
        the options', intersected), or ``None``. Records nothing.

        Raises:
            SpawnRejected: ``max_children``, ``max_agents`` or ``budget_exhausted``.
        """
        if self._max_children is not None:
            live = self._sessions.live(session_id)
            if live is not None and len(live) >= self._max_children:
                raise SpawnRejected(
                    "max_children",
                    f"{_where(parent, session_id)} has {len(live)} unfinished children and "
                    f"max_children is {self._max_children}: one must end before another "
                    "is spawned",
                )
        if self._max_agents is not None:
            root = session_id if parent is None else parent.root_session
            size = self._sessions.tree_size(root)
            if size >= self._max_agents:
                raise SpawnRejected(
                    "max_agents",
                    f"the tree of session {root!r} has {size} unfinished agents and "
                    f"max_agents is {self._max_agents}: one must end before another is spawned",
                )
        above = self._above(session_id, parent)
        if above is not None:
            for account in above.chain():
                problem = account.exhausted(anyio.current_time)
                if problem is not None:
                    raise SpawnRejected("budget_exhausted", problem)
        asked = spec.budget
        if options.budget is not None:
            asked = options.budget if asked is None else asked.intersect(options.budget)
        return asked

    def opened(self, record: ChildRecord, parent: ChildRecord | None, asked: Budget | None) -> None:
        """The record of a child :meth:`admit` let through exists: the spawn is charged to
        every account above it, and the child gets an account if anything above it or its
        own budget needs one, its budget carved from what is left above it."""
        if parent is not None and parent.account is None:
            # A root child without a budget delegates for the first time: its subtree is
            # summed from now on (its own usage so far included).
            parent.account = self._account(None, None, parent, parent.usage)
        above = self._above(record.session_id, parent)
        if above is None and asked is None:
            return  # most root children: nothing to account
        if above is not None:
            for account in above.chain():
                account.spawned += 1
        limit = asked if asked is None or above is None else asked.intersect(remaining(above))
        record.account = self._account(above, limit, record, Usage())

    def rerun(self, record: ChildRecord, request: Mapping[str, JSONValue]) -> None:
        """The account of a root spawn run again after a restart: the budget its journaled
        request asked for (none if it has none, or it cannot be read)."""
        saved = request.get("budget")
        if not isinstance(saved, dict):
            return
        try:
            limit = Budget.from_dict(saved)
        except (ConfigError, TypeError):
            logger.warning("the journaled budget of task %s is unreadable", record.task_id)
            return
        record.account = self._account(None, limit, record, Usage())

    def _above(self, session_id: str, parent: ChildRecord | None) -> Account | None:
        """The account a new child of ``session_id`` charges first, if any."""
        if parent is not None:
            return parent.account
        return self._sessions_budgets.get(session_id)

    def _account(
        self, above: Account | None, limit: Budget | None, record: ChildRecord, usage: Usage
    ) -> Account:
        return Account(
            parent=above,
            limit=limit,
            owner=record.task_id,
            where=str(record.agent_path),
            stop=self._stop,
            usage=usage,
        )

    # ------------------------------------------------------------------ sessions

    def open_session(self, session_id: str, budget: Budget) -> None:
        """Give root session ``session_id`` a budget, shared by every tree spawned into it
        from now on (its seconds counting from now).

        Raises:
            ConfigError: ``budget`` is no :class:`Budget`, the session has one already, has
                unfinished children, or is a child's own session.
            SpawnRejected: the session is closed, or the manager is not running.
        """
        if not self._sessions.accepting:  # its seconds count on the running event loop
            raise SpawnRejected(
                "manager_closed",
                "the subagent manager is not running: enter it with `async with` before "
                "open_session (or it was closed)",
            )
        if not isinstance(budget, Budget):
            raise ConfigError("budget", "a Budget", budget)
        if not isinstance(session_id, str):
            raise ConfigError("session_id", "a string", session_id)
        if self._sessions.get(session_id) is not None:
            raise ConfigError(
                "session_id", "a root session (a child's session holds its own budget)", session_id
            )
        if self._sessions.is_closed(session_id):
            raise SpawnRejected("session_closed", f"session {session_id!r} is closed")
        if session_id in self._sessions_budgets or self._sessions.live(session_id):
            raise ConfigError(
                "session_id", "a session with no budget and no unfinished children", session_id
            )
        account = Account(
            parent=None,
            limit=budget,
            owner=session_id,
            where=f"session {session_id!r}",
            stop=self._stop,
            session=True,
        )
        if budget.seconds is not None:
            account.deadline = anyio.current_time() + budget.seconds
            # A running child's watchdog ends it by then (Account.start); a child still in
            # the queue has none, so the session's end is armed too.
            alarm = self._alarms[session_id] = _Alarm(functools.partial(self._time_up, account))
            assert self._watchdog is not None, "attach() first"
            self._watchdog.arm(alarm, account.deadline)
        self._sessions_budgets[session_id] = account

    def session_budget(self, session_id: str) -> Account | None:
        """The account of root session ``session_id``'s budget, if it has one."""
        return self._sessions_budgets.get(session_id)

    def close_session(self, session_id: str) -> None:
        """``session_id`` is closing: its budget is let go (its children keep charging
        the account they hold until they end)."""
        self._sessions_budgets.pop(session_id, None)
        alarm = self._alarms.pop(session_id, None)
        if alarm is not None and self._watchdog is not None:
            self._watchdog.disarm(alarm)

    def _time_up(self, account: Account) -> None:
        """Session ``account``'s seconds have run out: each of its children still waiting
        in the queue ends ``timeout`` now, naming the budget (a running child's watchdog
        ends it at this deadline already; a new spawn is refused)."""
        self._alarms.pop(account.owner, None)
        assert self._ender is not None
        now = anyio.current_time()
        for record in list(self._sessions.live(account.owner) or ()):
            mine = record.account
            if record.state != QUEUED or record.sync or mine is None or mine.parent is not account:
                continue
            # As if it started now: no time is left, and the budget is named as its end.
            record.timeout = mine.start(record.timeout, now)
            self._ender.time_out(record)

    # ------------------------------------------------------------------ stopping

    def _stop(self, account: Account, message: str) -> None:
        """End the node of ``account``, whose budget ``message`` says was exceeded: its
        child (each live child of a session) ends ``BudgetExceeded``, everything below
        is cancelled at once, so nothing in the subtree reports again."""
        sessions = self._sessions
        if account.session:
            tops = list(sessions.live(account.owner) or ())
        else:
            record = sessions.get(account.owner)
            tops = [] if record is None or record.account is not account else [record]
        for record in tops:
            self._cancel_below(record, f"{account.where} ran out of budget")
            mine = record.account
            if (
                mine is None
                or mine.exceeded is not None
                or record.cancel_reason is not None
                or record.ending
                or record.envelope is not None
            ):
                continue  # its outcome is decided already (a success is never undone)
            mine.exceeded = message  # first: a queued child's envelope is made in cancel
            if not self._cancel(record, message):
                mine.exceeded = None

    def _cancel_below(self, record: ChildRecord, reason: str) -> None:
        stack = [record]
        while stack:
            live = self._sessions.live(stack.pop().task_id)
            if live:
                for child in list(live):
                    self._cancel(child, reason)
                    stack.append(child)


def _where(parent: ChildRecord | None, session_id: str) -> str:
    return f"session {session_id!r}" if parent is None else str(parent.agent_path)


def with_budget(options: SpawnOptions | None, budget: Budget | None) -> SpawnOptions | None:
    """``options`` carrying ``budget`` (a ``budget=`` argument), which may be given there
    or as the argument, not both."""
    if budget is None:
        return options
    if not isinstance(budget, Budget):
        raise ConfigError("budget", "a Budget or None", budget)
    if options is None:
        return SpawnOptions(budget=budget)
    if not isinstance(options, SpawnOptions):
        raise ConfigError("options", "a SpawnOptions or None", options)
    if options.budget is not None:
        raise ConfigError(
            "budget",
            f"given once: as budget= or as options.budget (here {options.budget!r}), not both",
            budget,
        )
    return attrs.evolve(options, budget=budget)


def charge_result(
    record: ChildRecord, status: Status, result: Result | str | None, attempt: int
) -> None:
    """Charge the usage of a completed runner's :class:`Result` (what its envelope will
    hold, of try ``attempt``) in place of what it reported; past its own budget, its
    envelope says so."""
    account = record.account
    if account is None or status is not Status.COMPLETED or not isinstance(result, Result):
        return
    new = result.usage
    if not new:
        return
    old = record.usage
    record.usage = new
    account.report(old, new, attempt, final=True)


def budget_outcome(record: ChildRecord, status: Status) -> tuple[Status, str, str] | None:
    """The status, error and error type of a child a budget ended, or ``None``."""
    account = record.account
    if account is None:
        return None
    if account.exceeded is not None:
        return Status.ERROR, account.exceeded, BUDGET_EXCEEDED
    if account.timed is not None and status is Status.TIMEOUT:
        return Status.TIMEOUT, f"{account.timed} ran out", BUDGET_EXCEEDED
    return None


def tree_usage(record: ChildRecord, usage: Usage) -> Usage:
    """The usage of ``record``'s subtree, its own ``usage`` included."""
    account = record.account
    return usage if account is None else account.tree_usage()


def usage_of(record: ChildRecord, tree: bool) -> Usage:
    """``record``'s own usage so far (or its envelope's), or with ``tree`` its subtree's."""
    envelope = record.envelope
    own = record.usage if envelope is None else envelope.usage
    if not tree:
        return own
    if record.account is not None:
        return record.account.tree_usage()  # counts children that outlived its envelope
    return own if envelope is None else envelope.tree_usage
