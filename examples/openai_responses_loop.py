"""A parent agent loop on the OpenAI Responses API that hands work to subagents.

``responses_loop`` takes the client as a parameter: pass ``openai.AsyncOpenAI()`` (as
``main`` does) or any object with the same async ``client.responses.create``; the tests
pass a fake one. Two things the Responses API needs: the client must be the async one (a
synchronous client blocks the event loop and freezes every background child during each
model call), and each reply's ``output`` items (``function_call``, reasoning) go back into
``input`` before the ``function_call_output`` items that answer them.

Run it (needs ``pip install openai`` and ``OPENAI_API_KEY``):
``python examples/openai_responses_loop.py "compare anyio, trio and asyncio"``
"""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio

from subagents import AgentSpec, Request, RunContext, SubagentManager
from subagents.tools import Toolset, build_tools

MODEL = "gpt-4.1-mini"


async def responses_loop(
    client: Any, toolset: Toolset, task: str, *, model: str = MODEL, max_turns: int = 50
) -> str:
    """Run the model until it answers without a tool call and no child is still running;
    returns its last text, or says the loop stopped after ``max_turns`` model calls."""
    tools = toolset.to_openai_responses()  # or toolset.to_openai_responses(strict=True)
    items: list[Any] = [{"role": "user", "content": task}]
    for _ in range(max_turns):
        reply = await client.responses.create(model=model, input=items, tools=tools)
        items += reply.output  # the calls first, then their outputs
        calls = [item for item in reply.output if item.type == "function_call"]
        if not calls:
            # The model ended its turn: sleep until a child finishes, then start a new turn.
            ready = await toolset.manager.completions(toolset.session_id)
            if not ready:
                return str(reply.output_text)
            # Hand the results to the model and collect them: completions() reports a
            # result until it is collected, and would wake the loop for it every turn.
            for envelope in ready:
                toolset.manager.collect(toolset.manager.handle(envelope.task_id))
            report = "\n\n".join(envelope.truncated() for envelope in ready)
            items.append({"role": "user", "content": f"Subagents finished:\n\n{report}"})
            continue
        for call in calls:
            result = await toolset.call(call.name, call.arguments, call_id=call.call_id)
            items.append(result.to_openai_responses(call.call_id))
    return f"[stopped: no final answer within {max_turns} model turns]"


async def researcher(request: Request, ctx: RunContext) -> str:
    await anyio.sleep(0.1)  # stands in for the child's own model calls
    return f"notes on {json.dumps(request.input)}: three sources agree"


async def main(task: str) -> None:
    from openai import AsyncOpenAI

    agents = [AgentSpec(name="researcher", description="Reads and summarises.", runner=researcher)]
    async with SubagentManager(agents) as manager:
        toolset = build_tools(manager, "root", engine_tool_timeout=60.0)
        print(await responses_loop(AsyncOpenAI(), toolset, task))


if __name__ == "__main__":
    anyio.run(main, " ".join(sys.argv[1:]) or "Research anyio, trio and asyncio in parallel.")
