"""``subagents batch run|status``: a JSONL or CSV of tasks fanned out to agents or commands.

This module is the command line (arguments, their checks, the wiring); the run itself is
``_cli_batch_run``, the input ``_cli_batch_inputs``, the results file
``_cli_batch_results``, the store's part ``_cli_batch_journal`` and ``batch status``
``_cli_batch_status``. design/batch.md is the whole story.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from typing import Any

import anyio
import attrs

from ._cli_batch_inputs import InputError, read_items
from ._cli_batch_run import Resume, Settings, run_batch
from ._cli_batch_status import run_status
from ._cli_batch_summary import EXIT_USAGE, halt_rule
from ._cli_events import positive_seconds
from ._cli_specs import SpecsError, load_specs, specs_reference
from ._errors import SubagentsError
from ._retry import RetryPolicy
from ._spec import AgentSpec
from .backends import _warden
from .backends.command import CommandRunner, _template_fields, command_agent

__all__ = ["register"]

_EPILOG = """\
Each line of --out is {"id": ..., "envelope": {DelegateResult}}, written once the
envelope is committed to the store. Exit status: 0 every item completed; 1-100 the number
that did not (malformed input lines included); 101 more; 2 a usage error; 1 a failed
write to the results or the store; 130 Ctrl-C; 143 SIGTERM (even after a failed write).
In a template, {{ and the }} that closes it are a literal { and }; any other brace stays
as written (jq '{a: {b: .x}}'). Example:
  subagents batch run --input items.jsonl --out results.jsonl -j 8 \\
      --command 'wc -c {path}'
  (a shell, the field its argument: --command 'sh -c "wc -c \\"$1\\"" sh {path}')"""


def register(commands: Any) -> None:
    """Add the ``batch`` command (``run``, ``status``) to an argparse subparsers object."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "batch", help="run a JSONL or CSV of tasks through agents or a command"
    )
    sub = parser.add_subparsers(dest="batch_command", required=True, metavar="SUBCOMMAND")
    run = sub.add_parser(
        "run",
        help="run every item; --resume goes on after a kill",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("--input", required=True, metavar="FILE", help="items.jsonl, items.csv or -")
    run.add_argument("--format", choices=("jsonl", "csv"), help="default: from the file name")
    run.add_argument("--out", required=True, metavar="FILE", help="the results, JSON lines")
    runner = run.add_mutually_exclusive_group(required=True)
    runner.add_argument(
        "--agent", type=specs_reference, metavar="MODULE:SPEC", help="an AgentSpec (or a list)"
    )
    # Not dest "command": that is the top-level subcommand's, which error messages name.
    runner.add_argument(
        "--command", dest="command_template", metavar="CMD",
        help="argv template, e.g. 'wc -c {path}'",
    )  # fmt: skip
    run.add_argument("--id-field", metavar="NAME", help="the item's id (default: its line)")
    run.add_argument(
        "--rename-duplicates", action="store_true", help="number repeated ids <id>-2, <id>-3"
    )
    run.add_argument(
        "--strict-input", action="store_true", help="a malformed line stops the run at the start"
    )
    run.add_argument("--template", metavar="TEXT", help="an agent's input, with {field}s")
    run.add_argument("-j", "--jobs", type=_jobs, default=16, help="items at once (default 16)")
    run.add_argument(
        "--timeout", type=positive_seconds, metavar="SECONDS",
        help="per item, retries included (default: the agent's own, else 1800)",
    )  # fmt: skip
    run.add_argument("--retries", type=_retries, metavar="N", help="tries after a failure")
    again = run.add_mutually_exclusive_group()
    again.add_argument(
        "--resume", action="store_true", help="run only the items without an envelope"
    )
    again.add_argument(
        "--retry-failed", action="store_true", help="also re-run error/timeout/cancelled ones"
    )
    run.add_argument("--halt", type=halt_rule, metavar="fail=N|fail=N%", help="stop admitting")
    run.add_argument("--keep-order", action="store_true", help="write results in input order")
    run.add_argument(
        "--progress", choices=("auto", "bar", "lines", "none"), default="auto",
        help="on stderr (auto: a bar on a terminal when CI is unset, else a line every 10 s)",
    )  # fmt: skip
    run.add_argument("--store", metavar="PATH", help="default: .subagents/batch.db beside --out")
    run.add_argument("--events", metavar="FILE", help="append lifecycle events as JSON lines")
    run.add_argument(
        "--grace", type=_grace, default=5.0, metavar="SECONDS",
        help="after Ctrl-C, before what runs is cancelled; SIGTERM to SIGKILL (default 5)",
    )  # fmt: skip
    run.add_argument(
        "--backend", choices=("asyncio", "trio"), default="asyncio",
        help="the event loop (default asyncio; trio must be installed)",
    )  # fmt: skip
    run.set_defaults(func=_run)
    status = sub.add_parser("status", help="counts by state, failures, ETA (changes nothing)")
    status.add_argument("--store", required=True, metavar="PATH", help="the batch's store")
    status.add_argument("--json", action="store_true", help="one JSON object per batch")
    status.set_defaults(func=run_status)


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
    return value


def _jobs(text: str) -> int:
    return _int_at_least(text, 1)


def _retries(text: str) -> int:
    return _int_at_least(text, 0)


def _grace(text: str) -> float:
    if text.strip() in ("0", "0.0"):
        return 0.0
    return positive_seconds(text)


def _usage(message: str) -> int:
    print(f"subagents batch run: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _specs(args: argparse.Namespace) -> list[AgentSpec]:
    if args.command_template is not None:
        return [command_agent(args.command_template, retries=args.retries or 0, grace=args.grace)]
    specs = load_specs(args.agent)
    if args.retries is None:
        return specs
    policy = RetryPolicy(attempts=args.retries + 1, retry_on=(Exception,))
    return [attrs.evolve(spec, retry=policy) for spec in specs]


def _unknown_columns(
    args: argparse.Namespace, specs: list[AgentSpec], columns: list[str] | None
) -> str | None:
    """A usage error for a ``{field}`` of the template that is no column of the CSV (every
    row would fail alike); ``None`` for JSONL, whose items may differ."""
    if columns is None:
        return None
    if args.command_template is not None:
        runner = specs[0].runner
        fields = runner.fields if isinstance(runner, CommandRunner) else frozenset()
        option = "--command"
    else:
        fields = _template_fields(args.template or "")
        option = "--template"
    missing = sorted(fields - set(columns))
    if not missing:
        return None
    return (
        f"{option}: {', '.join('{' + m + '}' for m in missing)} is no column of the CSV "
        f"header ({', '.join(columns) or 'none'})"
    )


def _run(args: argparse.Namespace) -> int:
    if args.template is not None and args.command_template is not None:
        return _usage("--template is an agent's input: with --command, use {field}s in it")
    out = args.out
    beside = os.path.dirname(os.path.abspath(out))
    store = args.store or os.path.join(beside, ".subagents", "batch.db")
    resume: Resume = "retry-failed" if args.retry_failed else "resume" if args.resume else "fresh"
    if resume == "fresh" and os.path.exists(out) and os.path.getsize(out) > 0:
        return _usage(f"{out} holds results already: --resume goes on with them (or remove it)")
    try:
        items = read_items(
            args.input, id_field=args.id_field, fmt=args.format,
            rename_duplicates=args.rename_duplicates,
        )  # fmt: skip
    except InputError as exc:
        return _usage(str(exc))
    except OSError as exc:  # a missing --input is the command line's mistake
        return _usage(f"--input {args.input}: {exc.strerror or exc}")
    if args.strict_input and items.malformed:
        line, why = items.malformed[0]
        more = f" (and {len(items.malformed) - 1} more)" if len(items.malformed) > 1 else ""
        return _usage(f"{args.input} line {line}: {why}{more}; nothing was run (--strict-input)")
    try:
        specs = _specs(args)
    except (SpecsError, SubagentsError) as exc:
        return _usage(f"--{'agent' if args.agent else 'command'}: {exc}")
    unknown = _unknown_columns(args, specs, items.columns)
    if unknown:
        return _usage(unknown)
    settings = Settings(
        out=out, store=store, specs=specs, template=args.template, jobs=args.jobs,
        timeout=args.timeout, resume=resume, halt=args.halt, keep_order=args.keep_order,
        progress=args.progress, events=args.events, grace=args.grace,
    )  # fmt: skip
    if args.backend == "trio" and importlib.util.find_spec("trio") is None:
        return _usage("--backend trio: trio is not installed (pip install trio)")
    try:
        os.makedirs(os.path.dirname(os.path.abspath(store)), exist_ok=True)
        # The warden ends the commands' process groups should this process be killed.
        with _warden.installed(args.grace):
            return anyio.run(run_batch, settings, items, sys.stderr, backend=args.backend)
    except SubagentsError as exc:  # the store cannot be opened, or failed
        print(f"subagents batch run: {exc}", file=sys.stderr)
        return 1
