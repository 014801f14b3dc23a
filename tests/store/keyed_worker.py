"""A process of its own that spawns with an idempotency key through a manager on a store
the tests share with it.

    python tests/store/keyed_worker.py run PATH SESSION KEY INPUT   # spawn, wait, print
    python tests/store/keyed_worker.py hold PATH SESSION KEY        # a child that never ends

``run`` prints one JSON line: the task id, its status and output, and how many times this
process ran a child. ``hold`` prints the task id once the spawn is journaled, then waits
for ``stop`` on stdin and closes its manager (which cancels the child). Every command
takes ``--backend asyncio|trio``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import anyio

from subagents import SubagentConfig, SubagentManager
from subagents._json import dumps_str
from tests.store.support import counted_agents

calls: list[str] = []
AGENTS = counted_agents(calls)


async def run(path: str, session: str, key: str, text: str) -> None:
    async with SubagentManager(AGENTS, config=SubagentConfig(store_path=path)) as manager:
        handle = manager.spawn("echo", text, session_id=session, idempotency_key=key)
        envelope = await handle.wait()
        line = {
            "task_id": handle.task_id,
            "status": envelope.status.value,
            "output": envelope.output,
            "calls": len(calls),
        }
    print(dumps_str(line), flush=True)


async def hold(path: str, session: str, key: str) -> None:
    async with SubagentManager(AGENTS, config=SubagentConfig(store_path=path)) as manager:
        handle = manager.spawn("forever", "held", session_id=session, idempotency_key=key)
        await handle.journaled()
        print(handle.task_id, flush=True)
        line = await anyio.to_thread.run_sync(sys.stdin.readline)
        if line.strip() != "stop":
            raise SystemExit(f"expected 'stop', got {line!r}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["run", "hold"])
    parser.add_argument("args", nargs="*")
    parser.add_argument("--backend", default="asyncio")
    ns = parser.parse_args()
    if ns.command == "run":
        anyio.run(run, *ns.args, backend=ns.backend)
    else:
        anyio.run(hold, *ns.args, backend=ns.backend)


if __name__ == "__main__":
    main()
