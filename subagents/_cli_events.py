"""``subagents events tail|summary|tree|timeline FILE``.

All read the JSONL event log a :class:`JsonlSink` writes. ``tail`` prints one
human-readable line per event and keeps following the file; ``summary`` prints counts by
status and agent, p50/p95/max durations, tokens by agent, the slowest and failed tasks;
``tree`` prints the delegation tree, one line per agent; ``timeline`` writes it as one
self-contained HTML page. ``tree`` and ``timeline`` read the log once, and work on the log
of a run that is still going.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from ._event_runs import read_run
from ._event_summary import summarize_events
from ._event_timeline import render_timeline
from ._event_tree import printable, render_tree
from ._events import COMPLETED, MISSED, PROGRESS, SPAWNED, STARTED, Event
from ._json import dumps_str
from ._jsonl import EventFollower, read_events

__all__ = ["format_event", "register", "tail"]


def register(commands: Any) -> None:
    """Add the ``events`` command (``tail``, ``summary``) to an argparse subparsers object."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "events", help="read a JSONL lifecycle event log (tail, summary, tree, timeline)"
    )
    sub = parser.add_subparsers(dest="events_command", required=True, metavar="SUBCOMMAND")

    tail_parser = sub.add_parser("tail", help="print one line per event and follow the file")
    tail_parser.add_argument("file", help="the JSONL event log")
    tail_parser.add_argument(
        "--no-follow", action="store_true", help="print what the file holds, then exit"
    )
    tail_parser.add_argument(
        "--from-end", action="store_true", help="skip what the file already holds"
    )
    tail_parser.add_argument(
        "--interval",
        type=positive_seconds,
        default=0.25,
        help="seconds between polls (default 0.25)",
    )
    tail_parser.add_argument(
        "--max-events",
        type=_positive_int,
        default=None,
        metavar="N",
        help="exit after printing N events (N >= 1)",
    )
    tail_parser.set_defaults(func=_lenient(_run_tail))

    summary_parser = sub.add_parser(
        "summary", help="counts, durations, tokens, slowest and failed tasks"
    )
    summary_parser.add_argument("file", help="the JSONL event log")
    summary_parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    summary_parser.add_argument(
        "--slowest",
        type=_non_negative_int,
        default=5,
        metavar="N",
        help="how many slowest tasks to list (default 5)",
    )
    summary_parser.set_defaults(func=_lenient(_run_summary))

    tree_parser = sub.add_parser(
        "tree", help="the delegation tree: status, duration, queue wait, tokens per agent"
    )
    tree_parser.add_argument("file", help="the JSONL event log (of a finished or running run)")
    tree_parser.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colour statuses and failures: auto (when stdout is a terminal), always, never",
    )
    tree_parser.set_defaults(func=_lenient(_run_tree))

    timeline_parser = sub.add_parser(
        "timeline", help="write the run as one self-contained HTML timeline (no network)"
    )
    timeline_parser.add_argument("file", help="the JSONL event log (of a finished or running run)")
    timeline_parser.add_argument(
        "-o",
        "--output",
        metavar="HTML",
        default=None,
        help="the page to write (default: FILE with the suffix .html)",
    )
    timeline_parser.set_defaults(func=_lenient(_run_timeline))


def _lenient(
    command: Callable[[argparse.Namespace], int],
) -> Callable[[argparse.Namespace], int]:
    """``command`` printing what the terminal's encoding cannot show as ``?``: the marks
    and box lines (and a log's names) are not in every code page (a Windows console,
    ``PYTHONIOENCODING=cp1252``), and a picture with a ``?`` beats a traceback."""

    def run(args: argparse.Namespace) -> int:
        for stream in (sys.stdout, sys.stderr):
            if isinstance(stream, io.TextIOWrapper):
                stream.reconfigure(errors="replace")
        return command(args)

    return run


def _positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def _when(timestamp_ms: int) -> str:
    seconds, millis = divmod(timestamp_ms, 1000)
    try:
        moment = datetime.fromtimestamp(seconds, tz=UTC)
    except (ValueError, OverflowError, OSError):
        # A log is any file: a time outside datetime's years (or the platform's) is shown
        # as the number it is, so one odd line never ends the tail.
        return f"timestamp_ms={timestamp_ms}"
    return moment.strftime("%H:%M:%S.") + f"{millis:03d}"


def format_event(event: Event) -> str:
    """One human-readable line for an event."""
    data = event.data
    head = f"{_when(event.timestamp_ms)} #{event.seq:<5} {event.type.removeprefix('subagent.'):<9}"
    where = f"{event.agent_path or '-'} [{event.task_id}]"
    if event.type == SPAWNED:
        detail = f"agent={data.get('agent')} mode={data.get('mode')}"
        timeout = data.get("timeout_s")
        if timeout is not None:
            detail += f" timeout={timeout}s"
    elif event.type == STARTED:
        detail = f"queued {data.get('queue_ms', 0)} ms"
    elif event.type == PROGRESS:
        usage = data.get("usage")
        tokens = (
            f" tokens {usage.get('input_tokens', 0)}/{usage.get('output_tokens', 0)}"
            if isinstance(usage, dict)
            else ""
        )
        detail = (
            f"iterations={data.get('iterations', 0)} output={data.get('output_chars', 0)} chars"
            + tokens
        )
    elif event.type == COMPLETED:
        usage = data.get("usage")
        detail = f"{data.get('status')} in {data.get('duration_ms', 0)} ms"
        if isinstance(usage, dict) and (usage.get("input_tokens") or usage.get("output_tokens")):
            detail += f" tokens {usage.get('input_tokens', 0)}/{usage.get('output_tokens', 0)}"
        if data.get("error"):
            error = str(data.get("error")).replace("\n", " ")
            detail += f" · {error[:200]}"
    elif event.type == MISSED:
        where = "-"
        detail = (
            f"{data.get('missed')} events dropped (seq {data.get('first_seq')}"
            f"..{data.get('last_seq')})"
        )
    else:
        detail = dumps_str(data)[:200]
    # A log is any file: its names and errors must not move the cursor or start a line.
    return printable(f"{head} {where}  {detail}")


def tail(
    path: str,
    *,
    out: TextIO,
    follow: bool = True,
    from_end: bool = False,
    interval: float = 0.25,
    max_events: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
    on_missing: Callable[[], None] | None = None,
) -> int:
    """Print the log's events as lines to ``out``; returns how many were printed.

    With ``follow``, keeps polling every ``interval`` seconds (blocking the thread) until
    ``max_events`` were printed or the process is interrupted; a file that does not exist
    yet is waited for, and ``on_missing`` is called each time a poll finds it absent after
    it was present (and on the first poll), so the caller can say what it is waiting for.

    Raises:
        OSError: the path exists but cannot be read (a directory, no permission).
    """
    follower = EventFollower(path, from_start=not from_end)
    printed = 0
    was_missing = False
    while True:
        batch = follower.poll() if follow else follower.finish()
        if follower.missing and not was_missing and on_missing is not None:
            on_missing()
        was_missing = follower.missing
        for event in batch:
            out.write(format_event(event) + "\n")
            printed += 1
            if max_events is not None and printed >= max_events:
                out.flush()
                return printed
        out.flush()
        if not follow:
            return printed
        sleep(interval)


def _run_tail(args: argparse.Namespace) -> int:
    if args.no_follow:
        # Without following, a file that is not there is an error, not something to wait for.
        reason = _unreadable(args.file)
        if reason:
            return _fail("tail", f"cannot read {args.file}: {reason}")

    def waiting() -> None:
        print(
            f"subagents events tail: waiting for {args.file} to be created (Ctrl-C to stop)",
            file=sys.stderr,
            flush=True,
        )

    try:
        tail(
            args.file,
            out=sys.stdout,
            follow=not args.no_follow,
            from_end=args.from_end,
            interval=max(args.interval, 0.01),
            max_events=args.max_events,
            on_missing=waiting,
        )
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:  # `... | head`: the reader left; not an error
        silence_stdout()
        return 0
    except OSError as exc:
        return _fail("tail", f"cannot read {args.file}: {_reason(exc)}")
    return 0


def _run_summary(args: argparse.Namespace) -> int:
    try:
        summary = summarize_events(read_events(args.file), slowest=args.slowest)
    except OSError as exc:
        return _fail("summary", f"cannot read {args.file}: {_reason(exc)}")
    if args.json:
        print(dumps_str(summary.to_dict()))
    elif summary.events == 0:
        print(f"no events in {args.file}")
    else:
        print("\n".join(printable(line) for line in summary.format().split("\n")))
    return 0


def _run_tree(args: argparse.Namespace) -> int:
    try:
        run = read_run(read_events(args.file, live=True))
    except OSError as exc:
        return _fail("tree", f"cannot read {args.file}: {_reason(exc)}")
    if args.color == "auto":
        colour = sys.stdout.isatty() and "NO_COLOR" not in os.environ
    else:
        colour = args.color == "always"
    if not run.tasks:
        print(f"no agents in {args.file}")
    else:
        print(render_tree(run, colour=colour))
    return 0


def _run_timeline(args: argparse.Namespace) -> int:
    source = Path(args.file)
    output = Path(args.output) if args.output else source.with_suffix(".html")
    if output.resolve() == source.resolve():
        return _fail("timeline", f"the page would overwrite the log {args.file}; give -o")
    try:
        run = read_run(read_events(source, live=True))
    except OSError as exc:
        return _fail("timeline", f"cannot read {args.file}: {_reason(exc)}")
    try:
        output.write_text(render_timeline(run, title=source.name), encoding="utf-8")
    except OSError as exc:
        return _fail("timeline", f"cannot write {output}: {_reason(exc)}")
    agents = len(run.tasks)
    print(f"wrote {output} ({agents} agent{'s' if agents != 1 else ''})")
    return 0


def _fail(command: str, message: str) -> int:
    print(f"subagents events {command}: {message}", file=sys.stderr)
    return 1


def _reason(exc: OSError) -> str:
    # The OS's own words ("Is a directory") without the errno and the repeated path.
    return exc.strerror or str(exc)


def silence_stdout() -> None:
    # Python flushes stdout again at exit; point it at devnull so that flush cannot fail.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _unreadable(path: str) -> str:
    """Why ``path`` cannot be opened for reading, or ``""`` when it can."""
    try:
        with open(path, "rb"):
            return ""
    except OSError as exc:
        return _reason(exc)
