"""Merging a task's journal writes that meet in one batch, in the writer thread before
the batch is applied (see ``merge_ends``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from ._journal_writes import EndWrite, SpawnWrite, StartWrite
from ._writer import Write

__all__ = ["merge_ends"]


def merge_ends(batch: Sequence[Write]) -> None:
    """In the writer, before a batch is applied: within each run between two writes that
    keep their places, a task's start and end are written by its unkeyed spawn when that
    is in the run too (its tries counted in the row; with its end, the row inserted ended
    after the run's puts), else its start by its end (one update instead of two). Each
    write stays in the batch, so its callback runs in its place."""
    spawns: dict[str, SpawnWrite] = {}
    starts: dict[str, StartWrite] = {}
    for write in batch:
        kind = type(write)
        if kind is SpawnWrite:
            spawn = cast(SpawnWrite, write)
            if spawn.entry.idempotency_key is None:
                spawns[spawn.entry.task_id] = spawn
                continue
        elif kind is StartWrite:
            start = cast(StartWrite, write)
            spawn_of = spawns.get(start.task_id)
            if spawn_of is not None:
                spawn_of.starts = 1  # a start of a running task changes nothing
                start.merged = True
            elif start.task_id in starts:  # the first one made it running: nothing to do
                start.merged = True
            else:
                starts[start.task_id] = start
            continue
        elif kind is EndWrite:
            end = cast(EndWrite, write)
            # An end that may deliver its envelope itself keeps its place among the ends:
            # the deliveries' ids are the mailbox's arrival order.
            found = None if end.deliver else spawns.pop(end.task_id, None)
            if found is not None:
                found.end = end
                end.merged = True
            else:
                started = starts.pop(end.task_id, None)
                if started is not None:
                    started.merged = True
                    end.starts = 1
            continue
        if write.order() is None:  # nothing moves across it
            spawns.clear()
            starts.clear()
