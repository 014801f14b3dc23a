"""The ``subagents`` command line: ``demo`` (and more subcommands registered here)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from . import _cli_events, _demo

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``subagents`` console script; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="subagents", description="Subagent orchestration runtime."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _demo.register(commands)
    _cli_events.register(commands)
    args = parser.parse_args(argv)
    try:
        status: int = args.func(args)
    except BrokenPipeError:
        # `subagents events summary FILE | head`: the reader left; that is not an error.
        _cli_events._silence_stdout()
        return 0
    return status
