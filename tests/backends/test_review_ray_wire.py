"""Review of what the Ray backend ships (no ray needed): the remote context's progress
must stay as bounded as the local one."""

from __future__ import annotations

import pickle

from subagents import Ruleset
from subagents._progress import MAX_OUTPUT_CHARS, Report
from subagents.backends._ray_wire import RemoteContext, Shipped


class Sink:
    def __init__(self) -> None:
        self.pushed: list[tuple[str, Report]] = []

    def push(self, task_id: str, report: Report) -> None:
        self.pushed.append((task_id, report))


def shipped() -> Shipped:
    return Shipped(
        task_id="t-1",
        parent_session_id="default",
        agent="worker",
        agent_path="/root/worker",
        parent_path="/root",
        attempt=1,
        permissions=Ruleset(),
        remaining=None,
        carrier={},
        sink="sink",
    )


def test_the_remote_snapshot_keeps_no_more_output_than_an_envelope_holds() -> None:
    # Locally, output past MAX_OUTPUT_CHARS is counted, not kept, and each append costs
    # what it appends; the remote snapshot concatenates everything (each append copying
    # all before it) and ships it all back in the reply.
    ctx = RemoteContext(shipped(), Sink())
    chunk = "x" * 100_000
    for _ in range(3 * MAX_OUTPUT_CHARS // len(chunk)):
        ctx.report(append=chunk)
    assert ctx.progress is not None
    assert len(pickle.dumps(ctx.progress)) < 2 * MAX_OUTPUT_CHARS
