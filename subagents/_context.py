"""What a running child sees of the runtime: its identity, deadline, and nested delegation."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import anyio

from ._account import remaining
from ._budget import Budget
from ._envelope import DelegateResult, Usage
from ._events import PROGRESS
from ._mailbox import closed_mailbox
from ._paths import AgentPath
from ._permissions import Ruleset
from ._progress import Progress, Report, validated_report
from ._record import SETTLED, ChildRecord
from ._spec import UNSET, _Unset

if TYPE_CHECKING:
    from ._handle import SpawnHandle
    from ._mailbox import BaseMailbox

    # The one import back up the graph: the public type of RunContext.manager.
    from ._manager import SubagentManager
    from ._messages import Message, PeerInfo, Receipt, Reply
    from ._messenger import Messenger
    from ._spec import SpawnOptions

__all__ = ["BaseContext", "RunContext", "absorb"]


class BaseContext:
    """What every run's context offers, wherever the runner runs: its deadline,
    permissions and :meth:`report` (one signature, one validation). A subclass records a
    validated report in :meth:`_apply`."""

    __slots__ = ()

    deadline: float | None
    permissions: Ruleset

    def remaining(self) -> float | None:
        """Seconds left before the watchdog fires, or ``None`` without a watchdog."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - anyio.current_time())

    def allows(self, tool: str) -> bool:
        """Whether this agent may use ``tool`` under its effective permissions."""
        return self.permissions.allows(tool)

    def report(
        self,
        *,
        output: str | None = None,
        append: str | None = None,
        usage: Usage | None = None,
        iterations: int | None = None,
        files_changed: Iterable[str] | None = None,
    ) -> None:
        """Record progress so far; a watchdog or cancellation keeps what was reported.

        ``output`` replaces the partial output, ``append`` extends it; ``usage`` and
        ``iterations`` replace the running totals; ``files_changed`` adds paths. Publishes
        ``subagent.progress``. Never blocks. The change of ``usage`` is charged to the
        budgets of this run and its ancestors at once: one it exceeds stops that agent's
        subtree (design/budgets.md). Under a retry policy each try reports its own total,
        from zero; what an earlier try spent stays charged. Each call costs time linear
        in what it reports; the envelope keeps the first million characters of output and
        the first thousand distinct paths, and says how much it dropped past them.

        Raises:
            ConfigError: a value of the wrong type or range (nothing is recorded then).
        """
        self._apply(validated_report(output, append, usage, iterations, files_changed))

    def _apply(self, report: Report) -> None:
        raise NotImplementedError


class RunContext(BaseContext):
    """Handed to a runner with its :class:`Request`; one per run (shared by retry attempts).

    A child's own session id is its task id: children it spawns report to its mailbox and
    are cancelled when it ends.
    """

    __slots__ = ("_manager", "_messenger", "_record", "attempt", "deadline", "permissions")

    def __init__(
        self,
        manager: SubagentManager,
        messenger: Messenger,
        record: ChildRecord,
        deadline: float | None,
    ) -> None:
        self._manager = manager
        self._messenger = messenger
        self._record = record
        self.attempt = 1
        """1 for the first try, 2 and up for retries of transient failures."""
        self.deadline = deadline
        """The watchdog deadline in :func:`anyio.current_time` units, or ``None``."""
        self.permissions: Ruleset = record.permissions
        """The effective ruleset: this agent's intersected with every ancestor's."""
        messenger.started(record, self)  # made as the runner starts: its inbox opens

    @property
    def task_id(self) -> str:
        """This run's task id."""
        return self._record.task_id

    @property
    def session_id(self) -> str:
        """The session this run's own children belong to (equal to :attr:`task_id`)."""
        return self._record.task_id

    @property
    def parent_session_id(self) -> str:
        """The session that spawned this run."""
        return self._record.session_id

    @property
    def agent(self) -> str:
        """The agent type's name."""
        return self._record.spec.name

    @property
    def agent_path(self) -> AgentPath:
        """This run's place in the tree, e.g. ``/root/general``."""
        return self._record.agent_path

    @property
    def parent_path(self) -> AgentPath:
        """The path of the agent that delegated this run."""
        return self._record.parent_path

    @property
    def manager(self) -> SubagentManager:
        """The manager running this child."""
        return self._manager

    def remaining_budget(self) -> Budget:
        """What this run and its subtree may still spend: in every field the least that
        its own budget and each ancestor's (its session's too) have left, ``None`` where
        none limits it; ``seconds`` counts down from now. Never blocks."""
        return remaining(self._record.account)

    def _apply(self, report: Report, progress: Progress | None = None) -> None:
        record = self._record
        if progress is not None:  # a run's whole progress, kept elsewhere (a remote worker)
            record.progress = progress
        elif record.progress is None:
            record.progress = Progress()
        progress = record.progress
        report.fold(progress)
        if report.usage is not None:
            old, record.usage = record.usage, report.usage
            if record.account is not None:  # charged to each ancestor as it arrives
                record.account.report(old, report.usage, self.attempt)
        if report.iterations is not None:
            record.iterations = report.iterations
        bus = self._manager.events
        if bus.active:
            bus.publish(
                PROGRESS,
                session_id=record.session_id,
                task_id=record.task_id,
                agent_path=record.agent_path,
                data={
                    "output_chars": progress.output_chars,
                    "iterations": record.iterations,
                    "usage": dict(record.usage.to_dict()),
                },
            )

    def spawn(
        self,
        agent: str,
        input: str = "",
        *,
        name: str | None = None,
        timeout: float | _Unset | None = UNSET,
        options: SpawnOptions | None = None,
        idempotency_key: str | None = None,
        budget: Budget | None = None,
    ) -> SpawnHandle:
        """Spawn a grandchild into this run's session; see :meth:`SubagentManager.spawn`
        (an ``idempotency_key`` is this session's: a retry of this run is the same run, so
        its repeat returns the grandchild the first attempt spawned).

        Raises :class:`SpawnRejected` (``session_closed``) once this run has ended.
        """
        self._record.check_can_delegate()
        return self._manager.spawn(
            agent,
            input,
            session_id=self.session_id,
            name=name,
            timeout=timeout,
            options=options,
            idempotency_key=idempotency_key,
            budget=budget,
        )

    async def execute(
        self,
        agent: str,
        input: str = "",
        *,
        name: str | None = None,
        timeout: float | _Unset | None = UNSET,
        options: SpawnOptions | None = None,
        budget: Budget | None = None,
    ) -> DelegateResult:
        """Delegate synchronously from this run; see :meth:`SubagentManager.execute`.

        Raises :class:`SpawnRejected` (``session_closed``) once this run has ended.
        """
        self._record.check_can_delegate()
        return await self._manager.execute(
            agent,
            input,
            session_id=self.session_id,
            name=name,
            timeout=timeout,
            options=options,
            budget=budget,
        )

    @property
    def mailbox(self) -> BaseMailbox:
        """This run's own mailbox, where its spawned children's envelopes land (a dropped
        one once this run has ended)."""
        if self._record.state == SETTLED:  # its record may be forgotten: never reopen it
            return closed_mailbox()
        return self._manager.mailbox(self.session_id)

    async def wait(self, task_id: str, timeout: float | None = None) -> DelegateResult | None:
        """Collect a child's envelope; see :meth:`SubagentManager.wait_result`."""
        return await self._manager.wait_result(task_id, timeout=timeout, session_id=self.session_id)

    # ------------------------------------------------------------------ messaging

    def send(
        self, to: str, body: str, *, reply_to: str | None = None, wake: bool = True
    ) -> Receipt:
        """Send ``body`` from this run to ``to``; never blocks.

        ``to`` is a task id or agent path of this run's tree (absolute, or relative: below
        this run first, then below the tree's root), the tree's host session id, or
        ``"*"``/``"all"``: every live agent of the tree but the sender (a broadcast never
        revives an ended agent). Another session's agents are unknown. ``wake=False``
        neither wakes an idle host loop nor revives.

        Returns the receipt (live: it moves forward as the message is delivered, read and
        answered; ``replied`` once a reply reached this sender; a broadcast's lists one
        receipt per recipient). A message to an ended agent fails ``ended`` naming its
        task, unless its agent is resumable: then it starts one follow-up run
        (``revived``). A full inbox fails ``full``.

        Raises:
            ConfigError: an empty or too long body (``MAX_MESSAGE_CHARS``), the sender's
                own address, a blank ``reply_to``. UnknownPeer: nobody at ``to`` in the
                sender's tree (the message names the address probably meant).
                SpawnRejected: the sender has ended (a host: its session is closed).
        """
        return self._messenger.send(self.task_id, to, body, reply_to=reply_to, wake=wake)

    async def recv(
        self, *, from_: str | None = None, timeout: float | None = None
    ) -> Message | None:
        """Take the oldest message sent to this run (from ``from_`` only, if given),
        waiting up to ``timeout`` seconds with this run's slot lent (``None``: until one
        comes or the inbox closes). Returns ``None`` if none came; one landing at the
        deadline counts. Cancelling the wait takes nothing. Raises as :meth:`send`."""
        return await self._messenger.recv(self.task_id, from_=from_, timeout=timeout)

    def inbox(
        self, *, peek: bool = False, from_: str | None = None, ids: Iterable[str] | None = None
    ) -> list[Message]:
        """The messages waiting for this run, oldest first: taken (receipts ``read``), or
        with ``peek`` left in place (receipts unchanged). ``ids``: only the messages with
        these ids still waiting: an agent loop peeks before its model call and takes
        exactly what it showed once the call returns (``inbox(ids=[m.id for m in
        shown])``), never a message that came meanwhile (the delivery point
        ``testing.run_tool_loop`` uses)."""
        return self._messenger.inbox(self.task_id, peek=peek, from_=from_, ids=ids)

    def peers(self) -> list[PeerInfo]:
        """Every agent of this run's tree but itself (at most ``MAX_PEERS``, nearest the
        root first): live ones and ended ones not forgotten."""
        return self._messenger.peers(self.task_id)

    async def ask(self, to: str, body: str, *, timeout: float | None = None) -> Reply:
        """Send ``body`` to one peer and wait up to ``timeout`` seconds, this run's slot
        lent, for the message that answers it (``reply_to`` its id, from that peer). The
        reply never lands in the inbox while this waits; a late one does. Returns at once
        with ``ended`` when the peer ends while this waits. Raises as :meth:`send` (and
        ``ConfigError`` for a broadcast)."""
        return await self._messenger.ask(self.task_id, to, body, timeout=timeout)

    def asides(self) -> list[tuple[Message, Message | None]]:
        """The messages this run's ``on_message`` responder answered on the side, each with
        its reply (``None``: it sent none), oldest first."""
        return self._messenger.asides(self.task_id)

    @property
    def previous(self) -> DelegateResult | None:
        """For a follow-up run of a resumable agent (started by a message to its ended
        run), the ended run's envelope (``previous.task_id`` is that run); else ``None``."""
        return self._messenger.previous(self.task_id)

    @property
    def revived_by(self) -> list[Message]:
        """For a follow-up run, the messages that started it, oldest first (their bodies
        are its input): answer one with ``send(m.from_, ..., reply_to=m.id)``, which
        marks its receipt ``replied`` (and answers an ``ask`` waiting for it)."""
        return self._messenger.revived_by(self.task_id)


def absorb(ctx: RunContext, report: Report, progress: Progress | None = None) -> None:
    """Record a run's progress that was kept elsewhere (a remote worker's): ``progress``
    replaces its partial output and files, ``report`` carries its usage and iterations
    (charged to budgets and published as a local report's are)."""
    ctx._apply(report, progress)
