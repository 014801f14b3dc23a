"""A run as its event log tells it: one record per task, nested into delegation trees.

Read in one pass over the events (O(events) time, O(tasks) memory), so it works on the log
of a run that is still going: a task spawned but not started is ``queued``, one started but
not ended is ``running``, and their times run to the log's last event. A child's events
name its parent's task id as their session; a task spawned into a session that is no task
of the log hangs from that root session. :mod:`._event_tree` and :mod:`._event_timeline`
draw the result.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import attrs

from ._events import COMPLETED, PROGRESS, SPAWNED, STARTED, Event
from ._json import JSONValue
from ._validators import as_int, as_str

__all__ = ["FAILED", "QUEUED", "RUNNING", "RunLog", "TaskRun", "preorder", "read_run"]

QUEUED = "queued"
"""The status of a task spawned and not started yet."""
RUNNING = "running"
"""The status of a task started and not ended yet."""
FAILED = frozenset({"error", "timeout"})
"""The statuses a picture of the run highlights as failures."""


@attrs.define(kw_only=True)
class TaskRun:
    """One task of the log: what its events said so far."""

    task_id: str
    """The task's id."""
    session_id: str
    """The session it reports to: its parent's task id, or a root session."""
    agent_path: str
    """Its place in the tree, e.g. ``/root/research/summarizer``."""
    agent: str = "?"
    """Its agent type (``?`` until an event names it)."""
    mode: str = "spawn"
    """``spawn`` or ``execute``."""
    status: str = QUEUED
    """``queued``, ``running``, or how it ended (``completed``, ``error``, ...)."""
    spawned_ms: int = 0
    """Unix ms of its spawn (of its first event when the log has no spawn)."""
    started_ms: int | None = None
    """Unix ms of its start, if it started."""
    ended_ms: int | None = None
    """Unix ms of its end, if it ended."""
    duration_ms: int = 0
    """Wall time from spawn to end (to the log's last event while unfinished)."""
    queue_ms: int = 0
    """Of it, the wait for a concurrency slot (still growing while queued)."""
    input_tokens: int = 0
    """Its own input tokens (the last progress report while unfinished)."""
    output_tokens: int = 0
    """Its own output tokens."""
    iterations: int = 0
    """Iterations it reported."""
    attempts: int = 1
    """Attempts it took."""
    error_type: str = ""
    """For failures: ``timeout``, ``cancelled`` or the exception class."""
    error: str = ""
    """For failures: the short error message."""
    output: str = ""
    """The output it ended with (bounded, for a summary)."""
    # Left out of repr and eq: both would recurse down the tree, and a log's tree may be
    # deeper than the interpreter's recursion limit.
    children: list[TaskRun] = attrs.field(factory=list, repr=False, eq=False)
    """Its subagents, in spawn order."""

    @property
    def ended(self) -> bool:
        """Whether the log has its end."""
        return self.ended_ms is not None

    @property
    def failed(self) -> bool:
        """Whether it ended in an error or a timeout."""
        return self.status in FAILED

    @property
    def depth(self) -> int:
        """Delegations below the root: 1 for ``/root/research``."""
        return max(self.agent_path.count("/") - 1, 1)


@attrs.frozen(kw_only=True)
class RunLog:
    """Every task of a log, and the trees they form."""

    events: int
    """Events read."""
    tasks: dict[str, TaskRun]
    """Every task, by id, in the order the log first named them."""
    sessions: dict[str, list[TaskRun]]
    """The top tasks of each root session (sessions in order of appearance)."""
    first_ms: int
    """Unix ms of the earliest spawn (0 for an empty log)."""
    last_ms: int
    """Unix ms of the log's last moment: its latest event or task end."""

    def walk(self) -> Iterator[TaskRun]:
        """Every task, depth first, each session's trees in spawn order."""
        return preorder([task for tops in self.sessions.values() for task in tops])

    def counts(self) -> dict[str, int]:
        """Tasks per status, in a fixed order (only the statuses present)."""
        found: dict[str, int] = {}
        for task in self.tasks.values():
            found[task.status] = found.get(task.status, 0) + 1
        order = ("completed", "error", "timeout", "cancelled", RUNNING, QUEUED)
        ranked = sorted(found, key=lambda s: (order.index(s) if s in order else len(order), s))
        return {status: found[status] for status in ranked}


def preorder(tasks: list[TaskRun]) -> Iterator[TaskRun]:
    """``tasks`` and everything below them, depth first, in spawn order."""
    stack = list(reversed(tasks))
    while stack:
        task = stack.pop()
        yield task
        stack.extend(reversed(task.children))


OUTPUT_KEPT = 300
"""Characters of a task's output a summary keeps."""
ERROR_KEPT = 1000
"""Characters of a task's error kept (the tree and the timeline show fewer)."""
NAME_KEPT = 200
"""Characters kept of a task's agent type, mode, status and error type."""
PATH_KEPT = 1000
"""Characters kept of a task's agent path."""


def read_run(events: Iterable[Event]) -> RunLog:
    """Build a :class:`RunLog` from events in log order (one pass; ``events`` may be a
    generator such as :func:`read_events`)."""
    tasks: dict[str, TaskRun] = {}
    count = 0
    last = 0
    for event in events:
        count += 1
        last = max(last, event.timestamp_ms)
        if not event.task_id or event.type not in (SPAWNED, STARTED, PROGRESS, COMPLETED):
            continue
        task = tasks.get(event.task_id)
        if task is None:
            task = tasks[event.task_id] = TaskRun(
                task_id=event.task_id,
                session_id=event.session_id,
                agent_path=event.agent_path[:PATH_KEPT],
                spawned_ms=event.timestamp_ms,
            )
        _apply(task, event)
    for task in tasks.values():
        if task.ended_ms is not None:
            last = max(last, task.ended_ms)
    for task in tasks.values():
        if not task.ended:
            _unfinished(task, last)
    first = min((t.spawned_ms for t in tasks.values()), default=0)
    return RunLog(events=count, tasks=tasks, sessions=_nest(tasks), first_ms=first, last_ms=last)


def _nest(tasks: dict[str, TaskRun]) -> dict[str, list[TaskRun]]:
    """Hang each task from its parent (the task its session names); the rest are the top
    tasks of their root sessions. A log is any file: tasks naming each other in a circle
    would hang from nothing, so each circle is cut above its member the log named first,
    which becomes a top task (the rest of the circle, and what hangs below it, stay
    nested)."""
    sessions: dict[str, list[TaskRun]] = {}
    for task in tasks.values():
        parent = tasks.get(task.session_id)
        if parent is not None and parent is not task:
            parent.children.append(task)
        else:
            sessions.setdefault(task.session_id, []).append(task)
    reached: set[str] = set()
    stack = [task for tops in sessions.values() for task in tops]
    while stack:
        task = stack.pop()
        reached.add(task.task_id)
        stack.extend(task.children)
    if len(reached) < len(tasks):
        _cut_circles(tasks, sessions, reached)
    return sessions


def _cut_circles(
    tasks: dict[str, TaskRun], sessions: dict[str, list[TaskRun]], reached: set[str]
) -> None:
    """Make one task of each circle a top task, so the circle and everything hanging below
    it are reached. Every task the top-down walk missed hangs, through its parents, from a
    circle; each is walked up once (``done`` remembers the walks before), so the cost is
    linear in the tasks."""
    order = {task_id: index for index, task_id in enumerate(tasks)}
    done = set(reached)
    for task_id in order:
        if task_id in done:
            continue
        path: list[str] = []
        on_path: set[str] = set()
        current = task_id
        while current not in done and current not in on_path:
            path.append(current)
            on_path.add(current)
            current = tasks[current].session_id
        if current in on_path:
            # ``current`` closes a circle: cut the edge above its member the log named first.
            circle = path[path.index(current) :]
            cut = tasks[min(circle, key=order.__getitem__)]
            tasks[cut.session_id].children.remove(cut)
            sessions.setdefault(cut.session_id, []).append(cut)
        done.update(path)


def _apply(task: TaskRun, event: Event) -> None:
    data = event.data
    if event.type == SPAWNED:
        task.spawned_ms = event.timestamp_ms
        task.agent = _str(data.get("agent"), task.agent)[:NAME_KEPT]
        task.mode = _str(data.get("mode"), task.mode)[:NAME_KEPT]
        if task.mode == "execute" and task.started_ms is None and not task.ended:
            task.status = RUNNING  # an execute runs in its caller's task at once
    elif event.type == STARTED:
        if task.started_ms is None:
            task.started_ms = event.timestamp_ms
            task.queue_ms = _int(data.get("queue_ms"))
        if not task.ended:
            task.status = RUNNING
    elif event.type == PROGRESS:
        if not task.ended:
            task.iterations = _int(data.get("iterations"))
            _tokens(task, data.get("usage"))
    else:
        _completed(task, event)


def _completed(task: TaskRun, event: Event) -> None:
    data = event.data
    task.status = _str(data.get("status"), "unknown")[:NAME_KEPT]
    task.agent = _str(data.get("agent"), task.agent)[:NAME_KEPT]
    task.duration_ms = _int(data.get("duration_ms"))
    task.queue_ms = _int(data.get("queue_ms"))
    task.iterations = _int(data.get("iterations"))
    task.attempts = max(_int(data.get("attempts")), 1)
    task.ended_ms = _int(data.get("timestamp_ms")) or event.timestamp_ms
    if task.started_ms is None and task.spawned_ms == event.timestamp_ms:
        # The log holds its end only (it began mid-run): its spawn is its duration back.
        task.spawned_ms = task.ended_ms - task.duration_ms
    task.error_type = _str(data.get("error_type"))[:NAME_KEPT]
    task.error = _str(data.get("error"))[:ERROR_KEPT]
    task.output = _str(data.get("output"))[:OUTPUT_KEPT]
    _tokens(task, data.get("usage"))


def _unfinished(task: TaskRun, last_ms: int) -> None:
    task.duration_ms = max(last_ms - task.spawned_ms, 0)
    if task.started_ms is None and task.mode != "execute":
        task.queue_ms = task.duration_ms


def _tokens(task: TaskRun, usage: JSONValue | None) -> None:
    if isinstance(usage, dict):
        task.input_tokens = _int(usage.get("input_tokens"))
        task.output_tokens = _int(usage.get("output_tokens"))


def _int(value: object) -> int:
    return as_int(value) or 0


def _str(value: object, default: str = "") -> str:
    return as_str(value) or default
