"""Account: what one node of a delegation tree (a child, or a root session given a budget)
has spent, with the budget it holds and the account of the node above it.

An account sums its whole subtree: the usage a child reports is added to its own account
and to every ancestor's, O(depth) per report, so each can be checked against its budget
as the usage arrives. :mod:`._ledger` makes accounts and stops what exceeds them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import anyio

from ._budget import Budget
from ._envelope import Usage

__all__ = ["Account", "Stop", "remaining"]

Stop = Callable[["Account", str], None]
"""``stop(account, message)``: end the node of an account whose budget was exceeded."""

UNLIMITED: Final = Budget()
_NO_USAGE: Final = Usage()


class Account:
    """The spending of one node's subtree (its own included) and the budget it holds."""

    __slots__ = (
        "attempt",
        "deadline",
        "exceeded",
        "limit",
        "owner",
        "parent",
        "session",
        "spawned",
        "stop",
        "stopped",
        "timed",
        "tokens_in",
        "tokens_out",
        "where",
    )

    def __init__(
        self,
        *,
        parent: Account | None,
        limit: Budget | None,
        owner: str,
        where: str,
        stop: Stop,
        session: bool = False,
        usage: Usage = Usage(),  # noqa: B008 - frozen: one shared empty Usage
    ) -> None:
        self.parent = parent
        self.limit = limit  # None: no budget of its own (it sums its subtree for roll-up)
        self.owner = owner  # the task id of its child, or the session id
        self.where = where  # the node in a message: "/root/a", "session 'root'"
        self.session = session
        self.stop = stop
        self.tokens_in = usage.input_tokens
        self.tokens_out = usage.output_tokens
        self.spawned = 0  # children spawned in its subtree, every depth
        self.attempt: int | None = None  # the try of its child whose total it charged last
        self.deadline: float | None = None  # its seconds budget's end, once started
        self.stopped = False  # its budget was exceeded and its node stopped
        self.exceeded: str | None = None  # why its child's envelope is BudgetExceeded
        self.timed: str | None = None  # the budget whose seconds are its child's deadline

    def tree_usage(self) -> Usage:
        """What the subtree has used, its own usage included."""
        return Usage(input_tokens=self.tokens_in, output_tokens=self.tokens_out)

    def chain(self) -> list[Account]:
        """This account and its ancestors, nearest first."""
        found: list[Account] = []
        account: Account | None = self
        while account is not None:
            found.append(account)
            account = account.parent
        return found

    def report(self, old: Usage, new: Usage, attempt: int, *, final: bool = False) -> None:
        """Its child's running total went from ``old`` to ``new`` in try ``attempt``:
        the change is charged (:meth:`charge`). A retry's total starts again from zero,
        so what an earlier try spent stays charged rather than being refunded by the
        next try's lower figure."""
        if attempt != self.attempt:
            if self.attempt is not None:
                old = _NO_USAGE
            self.attempt = attempt
        self.charge(
            new.input_tokens - old.input_tokens,
            new.output_tokens - old.output_tokens,
            final=final,
        )

    def charge(self, tokens_in: int, tokens_out: int, *, final: bool = False) -> None:
        """Add a change of its child's usage to this account and every ancestor's, and
        stop each node whose budget it exceeds (``final``: the child's own result, whose
        runner is over: its own envelope is marked rather than its run cancelled)."""
        over: list[tuple[Account, str]] | None = None
        account: Account | None = self
        while account is not None:
            account.tokens_in += tokens_in
            account.tokens_out += tokens_out
            if account.limit is not None:
                message = account.overshoot()
                if message is None:
                    account.stopped = False  # within budget again: a new crossing stops it
                elif final and account is self:
                    # Its own result past its own budget is the error, even when a report
                    # from below crossed the budget (and stopped nothing) while it settled.
                    self.stopped = True
                    self.exceeded = message
                elif not account.stopped:
                    over = [] if over is None else over
                    over.append((account, message))
            account = account.parent
        for account, message in over or ():
            account.stopped = True
            account.stop(account, message)

    def overshoot(self) -> str | None:
        """Which token budget this subtree has gone past and by how much, or ``None``."""
        limit = self.limit
        assert limit is not None
        used = self.tokens_in + self.tokens_out
        for name, cap, spent in (
            ("tokens", limit.tokens, used),
            ("input tokens", limit.input_tokens, self.tokens_in),
            ("output tokens", limit.output_tokens, self.tokens_out),
        ):
            if cap is not None and spent > cap:
                return (
                    f"budget of {cap:,} {name} of {self.where} exceeded by {spent - cap:,} "
                    f"({spent:,} used)"
                )
        return None

    def exhausted(self, now: Callable[[], float]) -> str | None:
        """Which budget leaves this subtree nothing to spawn a child with, or ``None``."""
        limit = self.limit
        if limit is None:
            return None
        used = self.tokens_in + self.tokens_out
        for name, cap, spent in (
            ("tokens", limit.tokens, used),
            ("input tokens", limit.input_tokens, self.tokens_in),
            ("output tokens", limit.output_tokens, self.tokens_out),
            ("spawns", limit.spawns, self.spawned),
        ):
            if cap is not None and spent >= cap:
                return f"budget of {cap:,} {name} of {self.where} exhausted ({spent:,} used)"
        if self.deadline is not None and now() >= self.deadline:
            return f"budget of {limit.seconds:g} s of {self.where} exhausted (its time is up)"
        return None

    def start(self, timeout: float | None, now: float) -> float | None:
        """Its child starts: its seconds budget starts counting. Returns the watchdog
        seconds that apply: ``timeout``, or less when an ancestor's (or its own) seconds
        budget ends first (remembered in :attr:`timed` for the envelope)."""
        limit = self.limit
        if limit is not None and limit.seconds is not None:
            self.deadline = now + limit.seconds
        end: float | None = None
        holder: Account | None = None
        for account in self.chain():
            if account.deadline is not None and (end is None or account.deadline < end):
                end, holder = account.deadline, account
        if end is None or holder is None or (timeout is not None and now + timeout <= end):
            return timeout
        seconds = holder.limit.seconds if holder.limit is not None else None
        self.timed = f"budget of {seconds:g} s of {holder.where}"
        return max(0.0, end - now)


def remaining(account: Account | None) -> Budget:
    """What is left to spend below ``account``: in every field the least any account of
    its chain has left (``None``: no account of the chain limits it)."""
    if account is None:
        return UNLIMITED
    left: dict[str, float | None] = dict.fromkeys(
        ("tokens", "input_tokens", "output_tokens", "seconds", "spawns")
    )
    now: float | None = None
    for node in account.chain():
        limit = node.limit
        if limit is None:
            continue
        used = node.tokens_in + node.tokens_out
        _least(left, "tokens", limit.tokens, used)
        _least(left, "input_tokens", limit.input_tokens, node.tokens_in)
        _least(left, "output_tokens", limit.output_tokens, node.tokens_out)
        _least(left, "spawns", limit.spawns, node.spawned)
        if node.deadline is not None:
            now = anyio.current_time() if now is None else now
            _least(left, "seconds", node.deadline, now)
        elif limit.seconds is not None:  # not started yet: all of it
            _least(left, "seconds", limit.seconds, 0.0)
    return Budget(
        tokens=_int(left["tokens"]),
        input_tokens=_int(left["input_tokens"]),
        output_tokens=_int(left["output_tokens"]),
        seconds=left["seconds"],
        spawns=_int(left["spawns"]),
    )


def _least(left: dict[str, float | None], name: str, cap: float | None, spent: float) -> None:
    if cap is None:
        return
    value = max(0, cap - spent)
    current = left[name]
    left[name] = value if current is None else min(current, value)


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)
