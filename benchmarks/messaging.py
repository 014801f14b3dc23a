"""W8: a message round trip between two live children (``ctx.send`` then ``ctx.recv``,
answered the same way) against the floor, an anyio memory object stream round trip
between two tasks, in the same run. Both return one sample (seconds) per round trip."""

from __future__ import annotations

from time import perf_counter

import anyio

from subagents import AgentSpec, Request, RunContext, SubagentConfig, SubagentManager

WARMUP = 200


async def subagents_round_trips(n: int) -> list[float]:
    """``n`` send -> recv -> reply -> recv round trips between two running children."""
    samples: list[float] = []

    async def pong(request: Request, ctx: RunContext) -> str:
        while True:
            message = await ctx.recv()
            if message is None or message.body == "stop":
                return "ok"
            ctx.send(message.from_, "pong", reply_to=message.id)

    async def ping(request: Request, ctx: RunContext) -> str:
        peer = request.input
        for _ in range(WARMUP + n):
            started = perf_counter()
            ctx.send(peer, "ping")
            await ctx.recv()
            samples.append(perf_counter() - started)
        ctx.send(peer, "stop")
        return "ok"

    specs = [
        AgentSpec(name="pong", description="answers", runner=pong),
        AgentSpec(name="ping", description="asks", runner=ping),
    ]
    config = SubagentConfig(tracing=False, spawn_timeout=None)
    async with SubagentManager(specs, config=config) as manager:
        answerer = manager.spawn("pong")
        asker = manager.spawn("ping", answerer.task_id)
        await asker.wait()
        await answerer.wait()
    return samples[WARMUP:]


async def stream_round_trips(n: int) -> list[float]:
    """The floor: ``n`` round trips over a pair of anyio memory object streams."""
    samples: list[float] = []
    to_pong, pong_in = anyio.create_memory_object_stream[str](1)
    to_ping, ping_in = anyio.create_memory_object_stream[str](1)

    async def pong() -> None:
        async with pong_in, to_ping:
            async for item in pong_in:
                await to_ping.send(item)

    async with anyio.create_task_group() as tg:
        tg.start_soon(pong)
        async with to_pong, ping_in:
            for _ in range(WARMUP + n):
                started = perf_counter()
                await to_pong.send("ping")
                await ping_in.receive()
                samples.append(perf_counter() - started)
    return samples[WARMUP:]
