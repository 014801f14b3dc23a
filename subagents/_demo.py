"""``subagents demo``: twelve simulated agents fanned out on embedded defaults.

Most succeed; one raises, one overruns a short watchdog, one is cancelled, and one
spawns two grandchildren (14 envelopes in all). Each envelope is printed as it lands,
then a summary table.

The same ``--seed`` gives the same envelopes (status, output, usage, iterations per
agent path); only ids, timestamps, durations and the order of landing vary. Each run
of a runner draws from its own generator, seeded from the seed and its agent path,
because one generator shared by concurrent runners hands out its numbers in whatever
order the runners happen to wake.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter
from importlib.util import find_spec
from typing import Any

import anyio

from ._cli_events import silence_stdout
from ._context import RunContext
from ._envelope import DelegateResult, Status, Usage
from ._events import COMPLETED, STARTED, Event
from ._json import dumps_str
from ._jsonl import JsonlSink
from ._manager import SubagentManager
from ._spec import AgentSpec, Request, Result, SpawnOptions, SubagentConfig

__all__ = ["register"]

_TOPICS = (
    "the retry policy",
    "the mailbox",
    "the watchdog",
    "cancellation",
    "the event stream",
    "agent paths",
    "permissions",
    "truncation",
)


def register(commands: Any) -> None:
    """Add the ``demo`` subcommand to an argparse subparsers object."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "demo",
        help="fan out twelve simulated agents and print their envelopes",
        description="Fan out twelve simulated agents (two of them grandchildren of a lead "
        "agent: 14 envelopes) on embedded defaults.",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=7,
        help="random seed: the same seed gives the same envelopes (default 7)",
    )
    parser.add_argument(
        "--backend", choices=("asyncio", "trio"), default="asyncio", help="event loop"
    )
    parser.add_argument(
        "--json", action="store_true", help="print each envelope as a JSON line instead"
    )
    parser.add_argument(
        "--events",
        metavar="FILE",
        help="also write every lifecycle event to FILE as JSON lines "
        "(then try `subagents events summary FILE`)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the demo; returns 0 when every spawn ended in exactly one envelope."""
    if find_spec(args.backend) is None:
        # trio is an optional dependency; anyio would report it as a LookupError traceback.
        print(
            f"subagents demo: --backend {args.backend} needs the {args.backend} package "
            f"(pip install {args.backend})",
            file=sys.stderr,
        )
        return 1
    sink = None
    if args.events:
        try:
            # A failed write is reported below, once the demo has finished: one line of
            # ours instead of the sink's log record.
            sink = JsonlSink(args.events, on_error=lambda exc: None)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            print(f"subagents demo: cannot write {args.events}: {reason}", file=sys.stderr)
            return 1
    try:
        status = anyio.run(_main, args.seed, args.json, sink, backend=args.backend)
    finally:
        if sink is not None:
            sink.close()
    if sink is not None and sink.error is not None:
        reason = sink.error.strerror or str(sink.error)
        print(
            f"subagents demo: writing {args.events} failed: {reason}; "
            f"the event log is incomplete ({sink.written} events written)",
            file=sys.stderr,
        )
        return 1
    return status


def _agents(seed: int) -> list[AgentSpec]:
    def rng_for(ctx: RunContext) -> random.Random:
        # A string seed is hashed with SHA-512, so it is the same in every process.
        return random.Random(f"{seed}:{ctx.agent_path}")

    async def researcher(request: Request, ctx: RunContext) -> Result:
        rng = rng_for(ctx)
        steps = rng.randint(2, 4)
        for step in range(1, steps + 1):
            await anyio.sleep(rng.uniform(0.02, 0.08))
            ctx.report(append=f"step {step}: read about {request.input}. ", iterations=step)
        tokens_in, tokens_out = rng.randint(200, 900), rng.randint(50, 300)
        return Result(
            output=f"Summary of {request.input}: it works as documented.",
            usage=Usage(input_tokens=tokens_in, output_tokens=tokens_out),
            iterations=steps,
        )

    async def flaky(request: Request, ctx: RunContext) -> str:
        await anyio.sleep(0.05)
        raise RuntimeError(f"simulated tool failure while handling {request.input!r}")

    async def slowpoke(request: Request, ctx: RunContext) -> str:
        ctx.report(output="started a long scan; 10% done")
        await anyio.sleep(60)
        return "never reached"

    async def lead(request: Request, ctx: RunContext) -> Result:
        first = ctx.spawn("researcher", f"{request.input} (part 1)")
        second = ctx.spawn("researcher", f"{request.input} (part 2)")
        parts = [await first.wait(), await second.wait()]
        # Its own usage only: the children's tokens are in their own envelopes.
        return Result(
            output=f"{len(parts)} parts: " + " / ".join(p.output for p in parts),
            usage=Usage(input_tokens=120, output_tokens=40),
            iterations=1,
        )

    return [
        AgentSpec(name="researcher", description="Reads about a topic.", runner=researcher),
        AgentSpec(name="flaky", description="Always fails.", runner=flaky),
        AgentSpec(name="slowpoke", description="Never finishes in time.", runner=slowpoke),
        AgentSpec(name="lead", description="Splits a topic between two helpers.", runner=lead),
    ]


async def _main(seed: int, as_json: bool, sink: JsonlSink | None = None) -> int:
    landed: list[DelegateResult] = []
    started = anyio.current_time()
    reader_left = False

    def show(text: str) -> None:
        # `subagents demo | head`: once the reader has left, print nothing more (the run
        # still finishes, so every child still ends in its envelope).
        nonlocal reader_left
        if reader_left:
            return
        try:
            print(text, flush=True)
        except BrokenPipeError:
            reader_left = True
            silence_stdout()

    def on_event(event: Event) -> None:
        if event.type != COMPLETED:
            return
        envelope = DelegateResult.from_dict(event.data)
        landed.append(envelope)
        show(dumps_str(envelope.to_dict()) if as_json else _line(envelope))

    config = SubagentConfig(max_concurrent_spawns=4, spawn_timeout=5.0)
    async with SubagentManager(_agents(seed), config=config) as manager:
        manager.events.subscribe(on_event)
        if sink is not None:
            sink.attach(manager.events)
        handles = [manager.spawn("researcher", topic) for topic in _TOPICS]
        handles.append(manager.spawn("flaky", "the build"))
        handles.append(manager.spawn("slowpoke", "the archive", options=SpawnOptions(timeout=0.4)))
        doomed = manager.spawn("slowpoke", "the attic", name="cancelled-scan")
        handles.append(doomed)
        handles.append(manager.spawn("lead", "the design notes"))
        # Cancelled once it is running (it has reported its progress by then): the same
        # envelope for a seed, however the children before it interleave.
        scan_started = anyio.Event()
        manager.events.subscribe(
            lambda e: (
                scan_started.set() if e.type == STARTED and e.task_id == doomed.task_id else None
            )
        )
        await scan_started.wait()
        doomed.cancel()
        for handle in handles:
            await handle.wait()
        spawned = manager.statistics().spawned
    if sink is not None:
        sink.close()  # before the summary, so the log is complete once the table prints
    elapsed = anyio.current_time() - started
    if not as_json and not reader_left:
        try:
            _summary(landed, elapsed)
        except BrokenPipeError:
            silence_stdout()
    exactly_once = len(landed) == spawned and len({e.task_id for e in landed}) == spawned
    if not exactly_once:
        print(f"error: {spawned} spawns but {len(landed)} envelopes", file=sys.stderr)
    return 0 if exactly_once else 1


def _line(envelope: DelegateResult) -> str:
    detail = _clip(" ".join((envelope.error or envelope.output).split()), 64)
    return (
        f"{envelope.status.value:<9} {envelope.agent_path:<32} "
        f"{envelope.duration_ms:>5} ms  {detail}"
    )


def _clip(text: str, width: int) -> str:
    """``text`` if it fits in ``width``, else its start and how much was cut."""
    if len(text) <= width:
        return text
    keep = width - len(f"… (+{len(text)} chars)")
    return f"{text[:keep]}… (+{len(text) - keep} chars)"


def _summary(landed: list[DelegateResult], elapsed: float) -> None:
    by_status = Counter(e.status.value for e in landed)
    tokens = sum((e.usage for e in landed), Usage())
    print()
    print(f"{'status':<10}{'count':>6}")
    for status in Status:
        print(f"{status.value:<10}{by_status.get(status.value, 0):>6}")
    print(f"{'total':<10}{len(landed):>6}")
    print()
    print(
        f"{len(landed)} envelopes in {elapsed:.2f} s; "
        f"tokens in {tokens.input_tokens} / out {tokens.output_tokens}"
    )
