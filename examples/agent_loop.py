"""A parent agent loop that spawns three subagents, keeps working, then collects them all.

The "model" is scripted (no API key needed): it plays the tool calls a real model would
make. Swap ``ScriptedModel`` for your provider's client and ``run_tool_loop`` for your own
loop; the toolset stays the same (``toolset.to_openai_chat()``, ``.to_anthropic()``, ...).

Run it: ``python examples/agent_loop.py``
"""

from __future__ import annotations

import anyio

from subagents import AgentSpec, Request, RunContext, SubagentManager
from subagents.testing import ScriptedModel, ToolCall, Transcript, run_tool_loop
from subagents.tools import build_tools


async def researcher(request: Request, ctx: RunContext) -> str:
    await anyio.sleep(0.05)  # stands in for a model call
    return f"notes on {request.input!r}: three sources agree"


def wait_for_all(transcript: Transcript) -> dict[str, object]:
    return {"task_ids": transcript.task_ids(), "mode": "all", "timeout_ms": 10_000}


async def main() -> None:
    agents = [AgentSpec(name="researcher", description="Reads and summarises.", runner=researcher)]
    async with SubagentManager(agents) as manager:
        toolset = build_tools(manager, "root", engine_tool_timeout=60.0, wait_timeout=30.0)
        model = ScriptedModel(
            [
                [
                    ToolCall("spawn_agent", {"agent": "researcher", "input": topic, "name": topic})
                    for topic in ("anyio", "trio", "asyncio")
                ],
                # The parent keeps working while the children run.
                ToolCall("list_agents", {}),
                ToolCall("wait_agent", wait_for_all),
                "All three summaries are in; writing the report.",
            ]
        )
        with model:
            transcript = await run_tool_loop(model, toolset)
        collected = transcript.collected()
        for entry in collected.values():
            assert isinstance(entry, dict)
            print(f"{entry['agent_path']} [{entry['status']}] {entry.get('output', '')}")
        print(f"collected {len(collected)} results; the model said: {transcript.texts[-1]}")


if __name__ == "__main__":
    anyio.run(main)
