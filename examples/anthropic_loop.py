"""A parent agent loop on the Anthropic Messages API that hands work to subagents.

``anthropic_loop`` takes the client as a parameter: pass ``anthropic.AsyncAnthropic()``
(as ``main`` does) or any object with the same async ``client.messages.create``; the tests
pass a fake one. The client must be the async one: a synchronous client called from async
code blocks the event loop, and every background child freezes for the length of each
model call.

Run it (needs ``pip install anthropic`` and ``ANTHROPIC_API_KEY``):
``python examples/anthropic_loop.py "compare anyio, trio and asyncio"``
"""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio

from subagents import AgentSpec, Request, RunContext, SubagentManager
from subagents.tools import Toolset, build_tools

MODEL = "claude-sonnet-4-5"


async def anthropic_loop(
    client: Any, toolset: Toolset, task: str, *, model: str = MODEL, max_turns: int = 50
) -> str:
    """Run the model until it answers without a tool call and no child is still running;
    returns its last text, or says the loop stopped after ``max_turns`` model calls."""
    tools = toolset.to_anthropic()
    messages: list[Any] = [{"role": "user", "content": task}]
    for _ in range(max_turns):
        reply = await client.messages.create(
            model=model, max_tokens=4096, messages=messages, tools=tools
        )
        messages.append({"role": "assistant", "content": reply.content})
        uses = [block for block in reply.content if block.type == "tool_use"]
        if not uses:
            # The model ended its turn: sleep until a child finishes, then start a new turn.
            ready = await toolset.manager.completions(toolset.session_id)
            if not ready:
                return "".join(block.text for block in reply.content if block.type == "text")
            # Hand the results to the model and collect them: completions() reports a
            # result until it is collected, and would wake the loop for it every turn.
            for envelope in ready:
                toolset.manager.collect(toolset.manager.handle(envelope.task_id))
            report = "\n\n".join(envelope.truncated() for envelope in ready)
            messages.append({"role": "user", "content": f"Subagents finished:\n\n{report}"})
            continue
        results = [
            (await toolset.call(use.name, use.input, call_id=use.id)).to_anthropic(use.id)
            for use in uses
        ]
        messages.append({"role": "user", "content": results})
    return f"[stopped: no final answer within {max_turns} model turns]"


async def researcher(request: Request, ctx: RunContext) -> str:
    await anyio.sleep(0.1)  # stands in for the child's own model calls
    return f"notes on {json.dumps(request.input)}: three sources agree"


async def main(task: str) -> None:
    from anthropic import AsyncAnthropic

    agents = [AgentSpec(name="researcher", description="Reads and summarises.", runner=researcher)]
    async with SubagentManager(agents) as manager:
        toolset = build_tools(manager, "root", engine_tool_timeout=60.0)
        print(await anthropic_loop(AsyncAnthropic(), toolset, task))


if __name__ == "__main__":
    anyio.run(main, " ".join(sys.argv[1:]) or "Research anyio, trio and asyncio in parallel.")
