"""Merging a task's journal writes that meet in one batch, in the writer thread before
the batch is applied (see ``merge_ends``)."""

from __future__ import annotations

from collections.abc import Sequence

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
        if isinstance(write, SpawnWrite) and write.entry.idempotency_key is None:
            spawns[write.entry.task_id] = write
        elif isinstance(write, StartWrite):
            for task_id in list(write.task_ids):
                spawn = spawns.get(task_id)
                if spawn is not None:
                    spawn.started = True  # a second start of a running task changes nothing
                    del write.task_ids[task_id]
                elif task_id in starts:  # the first one made it running: nothing to do
                    del write.task_ids[task_id]
                else:
                    starts[task_id] = write
        elif isinstance(write, EndWrite):
            # An end that may deliver its envelope itself keeps its place among the ends:
            # the deliveries' ids are the mailbox's arrival order.
            spawn = None if write.deliver else spawns.pop(write.task_id, None)
            start = starts.pop(write.task_id, None)
            if spawn is not None:
                spawn.end = write
                spawn.started = spawn.started or write.started  # a try the end counts
                write.merged = True
            elif start is not None:
                del start.task_ids[write.task_id]
                write.started = True
        elif write.order() is None:  # nothing moves across it
            spawns.clear()
            starts.clear()
