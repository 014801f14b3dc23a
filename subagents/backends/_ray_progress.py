"""What a remote run reported, as the driver of :mod:`subagents.backends.ray` follows it:
which runs it reads while they run, what counts as news, and one record of every
attempt's progress (each attempt's snapshot laid over what the earlier ones left, as a
local run's attempts share one ``Progress``). Nothing here imports ray."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._context import absorb

if TYPE_CHECKING:
    from .._context import RunContext
    from .._progress import Progress
    from ._ray_wire import Snapshot

__all__ = ["Reported", "mark", "watched"]


def watched(ctx: RunContext) -> bool:
    """Whether the driver follows ``ctx``'s progress while it runs: a token budget limits
    it, or someone listens to its events."""
    if ctx.manager.events.active:
        return True
    budget = ctx.remaining_budget()
    return not (
        budget.tokens is None and budget.input_tokens is None and budget.output_tokens is None
    )


def mark(snapshot: Snapshot) -> object:
    """What changes when a run reports something new (a report of the same values, or of
    paths already known, changes nothing the driver shows)."""
    return (snapshot.usage, snapshot.iterations, snapshot.progress.output_chars)


class Reported:
    """What one run's attempts reported, as one :class:`Progress`: each attempt's snapshot
    follows what the attempts before it left, as a local run's attempts share one."""

    __slots__ = ("ctx", "earlier", "latest")

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.earlier: Progress | None = None
        """The run's progress when the running attempt started."""
        self.latest: Progress | None = None

    def absorb(self, snapshot: Snapshot) -> None:
        """Make the running attempt's ``snapshot`` (all it reported so far) the record's."""
        earlier = self.earlier
        progress = snapshot.progress
        if earlier is not None:
            progress = earlier.followed_by(progress, replaced=snapshot.replaced)
        self.latest = progress
        absorb(self.ctx, snapshot.totals(), progress)
