"""``subagents store status PATH``, ``subagents store export PATH`` and
``subagents store vacuum PATH``: look into and compact a durable store's SQLite file.

``status`` and ``export`` change nothing on disk (not even ``-wal``/``-shm`` files);
``vacuum`` rewrites the file and gives up after ``--busy-timeout`` seconds when another
process holds the database. A file that is not a store, a lock held too long or an
unreadable row is one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable
from contextlib import closing
from pathlib import Path
from typing import Any, BinaryIO

from ._cli_events import positive_seconds
from ._json import dumps_str
from .store import DEFAULT_BUSY_TIMEOUT, StoreError
from .store._inspect import Sizes, StoreStatus, export, status, vacuum

__all__ = ["format_status", "register"]

_EXPORT_SHAPE = """\
Each line is one delivery of one envelope, in envelope order (with --unread, by session
and task id):
  {"session": ..., "task_id": ..., "envelope_id": ..., "recipient": ...,
   "state": "stored" | "read" | "expired" | "replaced", "envelope": {DelegateResult}}
"state": "stored" is unread; "recipient" and "state" are null for an envelope no mailbox
took (the journal wrote it: the mailbox was full or closed, or notify_completion=False)."""


def register(commands: Any) -> None:
    """Add the ``store`` command (``status``, ``export``, ``vacuum``) to an argparse
    subparsers object."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "store", help="look into a durable store's SQLite file (status, export, vacuum)"
    )
    sub = parser.add_subparsers(dest="store_command", required=True, metavar="SUBCOMMAND")

    status_parser = sub.add_parser(
        "status", help="rows by state, file sizes, schema version (changes nothing)"
    )
    status_parser.add_argument("path", help="the store's file")
    status_parser.add_argument("--json", action="store_true", help="print one JSON object")
    _busy_timeout(status_parser)
    status_parser.set_defaults(func=_run_status)

    export_parser = sub.add_parser(
        "export",
        help="the envelopes as JSON lines (changes nothing)",
        epilog=_EXPORT_SHAPE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    export_parser.add_argument("path", help="the store's file")
    export_parser.add_argument("--session", metavar="S", help="only the envelopes of session S")
    export_parser.add_argument(
        "--unread", action="store_true", help="only deliveries still 'stored' (not yet taken)"
    )
    export_parser.add_argument(
        "-o", "--output", metavar="FILE", help="write to FILE (whole, or not at all)"
    )
    _busy_timeout(export_parser)
    export_parser.set_defaults(func=_run_export)

    vacuum_parser = sub.add_parser(
        "vacuum", help="checkpoint the WAL and VACUUM: give freed pages back to the disk"
    )
    vacuum_parser.add_argument("path", help="the store's file")
    _busy_timeout(vacuum_parser)
    vacuum_parser.set_defaults(func=_run_vacuum)


def _busy_timeout(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--busy-timeout",
        type=positive_seconds,
        default=DEFAULT_BUSY_TIMEOUT,
        metavar="SECONDS",
        help=f"how long to wait for another process's lock (default {DEFAULT_BUSY_TIMEOUT:g})",
    )


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value, unit = n / 1024, "KiB"
    for bigger in ("MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.1f} {unit}"


def _sizes(sizes: Sizes) -> str:
    return f"{_size(sizes.total)} (db {_size(sizes.db)}, wal {_size(sizes.wal)})"


def _by_state(counts: dict[str, int]) -> str:
    inner = ", ".join(f"{state} {n}" for state, n in counts.items())
    return f"{sum(counts.values())} ({inner})"


def format_status(report: StoreStatus) -> str:
    """The human-readable lines of ``subagents store status``."""
    lines = {
        "store": report.path,
        "size": _sizes(report.sizes),
        "schema": f"version {report.schema_version} "
        f"(application_id {report.application_id:#x}: a subagents store)",
        "sessions": str(report.sessions),
        "tasks": _by_state(report.tasks),
        "envelopes": str(report.envelopes),
        "deliveries": _by_state(report.deliveries),
    }
    width = max(map(len, lines)) + 2
    return "\n".join(f"{name:<{width}}{value}" for name, value in lines.items())


def _run_status(args: argparse.Namespace) -> int:
    try:
        report = status(args.path, busy_timeout=args.busy_timeout)
    except StoreError as exc:
        return _fail("status", exc)
    print(dumps_str(report.to_dict()) if args.json else format_status(report))
    return 0


def _run_export(args: argparse.Namespace) -> int:
    if args.output is not None and _store_file(args.output, args.path):
        return _fail("export", f"refusing to write the export over the store {args.path!r}")
    lines = export(
        args.path, session=args.session, unread=args.unread, busy_timeout=args.busy_timeout
    )
    # Closed whatever happens (a reader that left, an error), so its connection is too.
    with closing(lines):
        try:
            if args.output is None:
                sys.stdout.flush()
                _write(lines, sys.stdout.buffer)
            else:
                _write_whole(lines, Path(args.output))
        except StoreError as exc:
            return _fail("export", exc)
        except BrokenPipeError:  # `... | head`: the command line's net handles it
            raise
        except OSError as exc:
            where = args.output or "stdout"
            return _fail("export", f"cannot write {where}: {exc.strerror or exc}")
    return 0


def _store_file(output: str, store: str) -> bool:
    """Whether ``output`` is the store or one of its side files (``-wal``, ``-shm``,
    ``-journal``), existing or not: replacing any of them would break it."""
    target = os.path.realpath(output)
    base = os.path.realpath(store)
    if target in {base, *(base + suffix for suffix in ("-wal", "-shm", "-journal"))}:
        return True
    try:
        return os.path.samefile(output, store)
    except OSError:
        return False


def _write(lines: Iterable[bytes], out: BinaryIO) -> None:
    for line in lines:
        out.write(line + b"\n")
    out.flush()


def _write_whole(lines: Iterable[bytes], target: Path) -> None:
    """Write into a new file beside ``target``, renamed over it once complete."""
    temporary = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        with temporary.open("wb") as out:
            _write(lines, out)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    os.replace(temporary, target)


def _run_vacuum(args: argparse.Namespace) -> int:
    try:
        before, after = vacuum(args.path, busy_timeout=args.busy_timeout)
    except StoreError as exc:
        return _fail("vacuum", exc)
    print(f"before  {_sizes(before)}")
    print(f"after   {_sizes(after)}")
    return 0


def _fail(command: str, exc: StoreError | str) -> int:
    print(f"subagents store {command}: {exc}", file=sys.stderr)
    return 1
