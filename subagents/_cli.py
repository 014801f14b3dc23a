"""The ``subagents`` command line: ``demo``, ``events``, ``store``, ``room``, ``mcp``,
``batch`` (each registered here).

Every failure is one line on stderr and a non-zero exit status: 2 for a usage error
(argparse), 1 for anything else (an unreadable file, a failed run); never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import NoReturn

from . import _cli_batch, _cli_events, _cli_mcp, _cli_room, _cli_store, _demo

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose usage errors are one line (subcommands inherit it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _version() -> str:
    try:
        return f"subagents {metadata.version('subagents')}"
    except metadata.PackageNotFoundError:
        # Imported from a source tree that was never installed: there is no metadata to
        # read, and a version copied into the code would drift from pyproject.toml.
        return "subagents (version unknown: the package is not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``subagents`` console script; returns the exit status."""
    parser = _Parser(prog="subagents", description="Subagent orchestration runtime.")
    parser.add_argument("--version", action="version", version=_version())
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _demo.register(commands)
    _cli_events.register(commands)
    _cli_store.register(commands)
    _cli_room.register(commands)
    _cli_mcp.register(commands)
    _cli_batch.register(commands)
    args = parser.parse_args(argv)
    try:
        status: int = args.func(args)
    except BrokenPipeError:
        # `subagents events summary FILE | head`: the reader left; that is not an error.
        _cli_events.silence_stdout()
        return 0
    except KeyboardInterrupt:
        # Ctrl-C is how a user stops a command; the conventional status, no traceback.
        return 130
    except OSError as exc:
        # A command reports the failures it expects itself; this is the net under the rest.
        print(f"subagents {args.command}: {exc}", file=sys.stderr)
        return 1
    return status
