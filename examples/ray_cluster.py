"""Run each child on a Ray cluster: the manager stays here, the runners run on Ray workers.

    pip install 'subagents[ray]'
    python examples/ray_cluster.py       # starts a small local cluster, or joins RAY_ADDRESS

Prints each child's status and output, and the worker process each one ran in.
"""

from __future__ import annotations

import os

import anyio
import ray

from subagents import AgentSpec, Request, RunContext, SubagentManager
from subagents.backends.ray import RayBackend


async def summarise(request: Request, ctx: RunContext) -> str:  # module-level: importable
    ctx.report(output="reading...", iterations=1)  # reaches the envelope on the driver
    return f"summary of {request.input} (worker pid {os.getpid()})"


async def main() -> None:
    backend = RayBackend(pool_size=2, force_after=5.0)  # or mode="task"
    agents = [AgentSpec(name="summarise", runner=summarise)]
    async with SubagentManager(agents, backend=backend) as manager:
        handles = [manager.spawn("summarise", f"chapter {n}", timeout=60) for n in (1, 2, 3)]
        for handle in handles:
            envelope = await handle.wait()
            print(envelope.status.value, envelope.output)
    backend.close()


if __name__ == "__main__":
    ray.init(num_cpus=2, include_dashboard=False)  # or ray.init(address="auto")
    try:
        anyio.run(main)  # asyncio; anyio.run(main, backend="trio") works too
    finally:
        ray.shutdown()
