"""``subagents events tree``: the delegation tree of a run, one line per agent.

Each line: the agent's place (nested by the tree; below :data:`NESTED_LEVELS` levels a
task is shown flat under its ancestor at that level, named by the seed's ``parent>child``
breadcrumb of its path below it), its status, duration, queue wait and tokens, and for a
failure its error. Failures are marked on every output (``✗``) and coloured when colour is
on (a terminal, or ``--color=always``). A run still going shows its unfinished agents as
``running`` or ``queued``, timed to the log's last event.
"""

from __future__ import annotations

from collections.abc import Iterator

from ._event_runs import QUEUED, RUNNING, RunLog, TaskRun, preorder

__all__ = [
    "NESTED_LEVELS",
    "error_text",
    "format_duration",
    "printable",
    "render_tree",
    "tree_rows",
]

NESTED_LEVELS = 4
"""Indentation levels drawn; deeper tasks are shown flat under their ancestor at this
level, with a ``parent>child`` breadcrumb."""
LABEL_WIDTH = 48
"""Widest label column (tree prefix and name); a longer name is cut with an ellipsis."""
ERROR_CHARS = 100
"""Characters of a failure's error shown on its line."""

_MARKS = {
    "completed": "✓",
    "error": "✗",
    "timeout": "✗",
    "cancelled": "-",
    RUNNING: "…",
    QUEUED: "·",
}
_COLOURS = {
    "completed": "32",  # green
    "error": "1;31",  # bold red
    "timeout": "1;31",
    "cancelled": "33",  # yellow
    RUNNING: "36",  # cyan
    QUEUED: "2",  # dim
}


# C0 and C1 control characters, DEL and the Unicode line and paragraph separators.
_CONTROLS = {
    code: f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    for code in [*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029]
}


def printable(text: str) -> str:
    """``text`` with its control characters shown as escapes (``\\x1b``): a log is any
    file, and a name or error must not move the cursor, retitle the terminal or start a
    line of its own."""
    return text.translate(_CONTROLS)


def format_duration(ms: int) -> str:
    """``412 ms``, ``1.20 s``, ``2m05s``, ``1h02m``."""
    if ms < 1000:
        return f"{ms} ms"
    if ms < 59_995:  # from there it rounds to "60.00 s": a minute, written as one
        return f"{ms / 1000:.2f} s"
    seconds = max(ms // 1000, 60)
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m"


def render_tree(run: RunLog, *, colour: bool = False) -> str:
    """The tree of ``run`` as text (no trailing newline); ``"no agents"`` for a log
    without tasks."""
    if not run.tasks:
        return "no agents"
    rows = list(tree_rows(run))
    width = min(max(len(prefix) + len(label) for prefix, label, _ in rows), LABEL_WIDTH)
    lines = [_headline(run), ""]
    for prefix, label, task in rows:
        if task is None:
            lines.append(prefix + label)
            continue
        room = max(width - len(prefix), 1)
        name = label if len(label) <= room else label[: room - 1] + "…"
        lines.append(f"{prefix}{name:<{room}}  {_facts(task, colour)}")
    return "\n".join(lines)


def _headline(run: RunLog) -> str:
    counts = ", ".join(f"{n} {printable(status)}" for status, n in run.counts().items())
    tokens_in = sum(t.input_tokens for t in run.tasks.values())
    tokens_out = sum(t.output_tokens for t in run.tasks.values())
    agents = len(run.tasks)
    line = (
        f"{agents} agent{'s' if agents != 1 else ''} ({counts}) · "
        f"tokens in {tokens_in} / out {tokens_out} · "
        f"{format_duration(max(run.last_ms - run.first_ms, 0))}"
    )
    if any(not t.ended for t in run.tasks.values()):
        line += " so far (unfinished agents are timed to the log's last event)"
    return line


def _facts(task: TaskRun, colour: bool) -> str:
    status = f"{_MARKS.get(task.status, '?')} {printable(task.status):<9}"
    if colour:
        status = f"\x1b[{_COLOURS.get(task.status, '0')}m{status}\x1b[0m"
    facts = (
        f"{status} {format_duration(task.duration_ms):>8}  "
        f"queue {format_duration(task.queue_ms):>7}  "
        f"tokens {task.input_tokens}/{task.output_tokens}"
    )
    if task.attempts > 1:
        facts += f"  attempts {task.attempts}"
    text = error_text(task)
    if text:
        facts += "  " + (f"\x1b[31m{text}\x1b[0m" if colour and task.failed else text)
    return facts


def error_text(task: TaskRun) -> str:
    """What went wrong with a task that did not complete, on one line, bounded (``""``
    for one that completed or has not ended)."""
    if task.status in ("completed", RUNNING, QUEUED):
        return ""
    text = printable(" ".join(task.error.split()) or task.error_type)
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 1] + "…"


def tree_rows(run: RunLog) -> Iterator[tuple[str, str, TaskRun | None]]:
    """``(tree prefix, label, task)`` per line of the tree, depth first; a session's own
    line has no task."""
    for session, tops in run.sessions.items():
        yield "", f"session {printable(session)}", None
        yield from _children(tops, "", 1, None)


def _children(
    tasks: list[TaskRun], indent: str, level: int, anchor: TaskRun | None
) -> Iterator[tuple[str, str, TaskRun | None]]:
    """The lines of ``tasks`` (siblings) and below them. At the last nested level each
    task's subtree is flattened under it, labelled by the path below ``anchor``."""
    shown = tasks if level <= NESTED_LEVELS else list(preorder(tasks))
    for index, task in enumerate(shown):
        last = index == len(shown) - 1
        branch = "└── " if last else "├── "
        yield indent + branch, _label(task, anchor, top=level == 1), task
        if level <= NESTED_LEVELS and task.children:
            below = indent + ("    " if last else "│   ")
            # The children of the last nested level carry its task as their anchor.
            yield from _children(
                task.children, below, level + 1, task if level == NESTED_LEVELS else None
            )


def _label(task: TaskRun, anchor: TaskRun | None, *, top: bool) -> str:
    """The task's name, printable; below ``anchor``, its breadcrumb from there
    (``child>grandchild``); a top task (whose parent is not in the log when it is deep) its
    path below the root."""
    return printable(_name(task, anchor, top=top))


def _name(task: TaskRun, anchor: TaskRun | None, *, top: bool) -> str:
    segments = task.agent_path.strip("/").split("/")
    if anchor is not None:
        below = anchor.agent_path.strip("/").split("/")
        if segments[: len(below)] == below:
            return ">".join(segments[len(below) :]) or task.task_id
    if top and len(segments) > 2:
        return ">".join(segments[1:])
    return segments[-1] or task.task_id
