"""A parent agent loop on OpenAI Chat Completions that hands work to subagents.

``chat_loop`` takes the client as a parameter: pass ``openai.AsyncOpenAI()`` (as ``main``
does) or any object with the same async ``client.chat.completions.create``; the tests pass
a fake one. The client must be the async one: a synchronous client called from async code
blocks the event loop, and every background child freezes for the length of each model
call.

Run it (needs ``pip install openai`` and ``OPENAI_API_KEY``):
``python examples/openai_chat_loop.py "compare anyio, trio and asyncio"``
"""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio

from subagents import AgentSpec, Request, RunContext, SubagentManager
from subagents.tools import Toolset, build_tools

MODEL = "gpt-4.1-mini"


async def chat_loop(
    client: Any, toolset: Toolset, task: str, *, model: str = MODEL, max_turns: int = 50
) -> str:
    """Run the model until it answers without a tool call and no child is still running;
    returns its last text, or says the loop stopped after ``max_turns`` model calls."""
    tools = toolset.to_openai_chat()  # or toolset.to_openai_chat(strict=True)
    messages: list[Any] = [{"role": "user", "content": task}]
    for _ in range(max_turns):
        reply = await client.chat.completions.create(model=model, messages=messages, tools=tools)
        message = reply.choices[0].message
        messages.append(message)
        if not message.tool_calls:
            # The model ended its turn: sleep until a child finishes, then start a new turn.
            ready = await toolset.manager.completions(toolset.session_id)
            if not ready:
                return str(message.content or "")
            # Hand the results to the model and collect them: completions() reports a
            # result until it is collected, and would wake the loop for it every turn.
            for envelope in ready:
                toolset.manager.collect(toolset.manager.handle(envelope.task_id))
            report = "\n\n".join(envelope.truncated() for envelope in ready)
            messages.append({"role": "user", "content": f"Subagents finished:\n\n{report}"})
            continue
        for call in message.tool_calls:
            name, arguments = call.function.name, call.function.arguments  # JSON text is fine
            result = await toolset.call(name, arguments, call_id=call.id)
            messages.append(result.to_openai_chat(call.id))
    return f"[stopped: no final answer within {max_turns} model turns]"


async def researcher(request: Request, ctx: RunContext) -> str:
    await anyio.sleep(0.1)  # stands in for the child's own model calls
    return f"notes on {json.dumps(request.input)}: three sources agree"


async def main(task: str) -> None:
    from openai import AsyncOpenAI

    agents = [AgentSpec(name="researcher", description="Reads and summarises.", runner=researcher)]
    async with SubagentManager(agents) as manager:
        # fmt: off
        toolset = build_tools(
            manager, "root",
            engine_tool_timeout=60.0,              # your loop kills a tool call after 60 s
            tool_timeouts={"wait_agent": 120.0},   # ...but lets wait_agent run 120 s
            wait_timeout=30.0,                     # wait_agent's default wait
        )
        # fmt: on
        print(await chat_loop(AsyncOpenAI(), toolset, task))


if __name__ == "__main__":
    anyio.run(main, " ".join(sys.argv[1:]) or "Research anyio, trio and asyncio in parallel.")
