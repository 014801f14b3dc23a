"""``subagents demo``: a dozen simulated agents fanned out on embedded defaults."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register"]


def register(commands: Any) -> None:
    """Add the ``demo`` subcommand to an argparse subparsers object."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "demo", help="fan out a dozen simulated agents and print their envelopes"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the demo (placeholder until the demo lands)."""
    print("demo: not yet implemented")
    return 0
