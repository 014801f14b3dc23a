"""End to end: ``subagents mcp serve`` in a real subprocess (``python -m subagents``, this
checkout first on its path, warnings as errors), driven by the SDK's own client. Over
stdio: list, spawn → wait, a wait that reports progress while another call cancels the
child it waits on, and a second server on the same ``--store`` answering for the first
one's task. Over streamable HTTP: spawn → wait, then SIGTERM ends the server cleanly."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import anyio.streams.text
import pytest
from mcp import Client, StdioServerParameters

from tests.mcp.support import spawn, structured

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
INFO = {"name": "test", "version": "0"}


COMMAND = ["-m", "subagents", "mcp", "serve", "--agents", "tests.mcp.agents:SPECS"]
ENV = {
    "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    "PYTHONWARNINGS": "error",
}


def serve(*args: str) -> StdioServerParameters:
    """``subagents mcp serve --agents tests.mcp.agents:SPECS *args`` as the client runs it."""
    return StdioServerParameters(
        command=sys.executable, args=[*COMMAND, *args], env=ENV, cwd=str(ROOT)
    )


async def test_mcp_serve_over_stdio_end_to_end(tmp_path: Path) -> None:
    store = str(tmp_path / "runs.db")
    seen: list[tuple[float, str | None]] = []
    async with Client(serve("--store", store, "--progress-every", "0.05")) as client:
        listed = await client.list_tools()
        assert [tool.name for tool in listed.tools] == [
            "spawn_agent",
            "wait_agent",
            "delegate_to_agent",
            "cancel_agent",
            "list_agents",
        ]
        echo_id = await spawn(client, "echo", "over stdio")
        waited = await client.call_tool("wait_agent", {"task_ids": echo_id, "timeout_ms": 30_000})
        [envelope] = structured(waited)["results"]
        assert envelope["output"] == "echo: over stdio"

        sleeper_id = await spawn(client, "sleeper", "forever")
        reported = anyio.Event()

        async def progress(value: float, total: float | None, message: str | None) -> None:
            seen.append((value, message))
            reported.set()

        async def cancel_once_reported() -> None:
            await reported.wait()
            cancelled = await client.call_tool("cancel_agent", {"task_id": sleeper_id})
            assert structured(cancelled)["cancel_requested"] is True

        async with anyio.create_task_group() as group:
            group.start_soon(cancel_once_reported)
            arguments = {"task_ids": sleeper_id, "timeout_ms": 30_000}
            result = await client.call_tool("wait_agent", arguments, progress_callback=progress)
        [envelope] = structured(result)["results"]
        assert envelope["status"] == "cancelled"
    assert seen[0][1] == "0 of 1 finished"
    assert [value for value, _ in seen] == sorted({value for value, _ in seen})

    async with Client(serve("--store", store)) as client:
        again = await client.call_tool("wait_agent", {"task_ids": echo_id, "timeout_ms": 0})
    [envelope] = structured(again)["results"]
    assert (envelope["task_id"], envelope["output"]) == (echo_id, "echo: over stdio")
    assert envelope["already_collected"] is True


async def test_mcp_serve_over_streamable_http_until_sigterm() -> None:
    command = [sys.executable, *COMMAND, "--transport", "streamable-http", "--port", "0"]
    async with await anyio.open_process(
        command,
        cwd=ROOT,
        env={**os.environ, **ENV},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    ) as process:
        assert process.stderr is not None
        log = ""
        async for chunk in process.stderr:  # until uvicorn names the port it bound
            log += chunk.decode()
            if found := re.search(r"Uvicorn running on (http://\S+)", log):
                break
        assert found, log
        async with Client(found.group(1) + "/mcp") as client:
            task_id = await spawn(client, "echo", "over http")
            waited = await client.call_tool("wait_agent", {"task_ids": task_id})
        [envelope] = structured(waited)["results"]
        assert envelope["output"] == "echo: over http"
        process.send_signal(signal.SIGTERM)
        async for chunk in process.stderr:
            log += chunk.decode()
        assert await process.wait() == 0, log
    assert "Traceback" not in log


async def test_sigterm_closes_the_manager_of_a_stdio_server_first(tmp_path: Path) -> None:
    """The child running at SIGTERM ends cancelled (the manager closed it), not
    ``Interrupted`` (what a restart finds of a killed process's children)."""
    store = str(tmp_path / "runs.db")
    async with await anyio.open_process(
        [sys.executable, *COMMAND, "--store", store],
        cwd=ROOT,
        env={**os.environ, **ENV},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as process:
        assert process.stdin is not None
        assert process.stdout is not None
        lines = anyio.streams.text.TextReceiveStream(process.stdout)
        pending = ""

        async def request(message: dict[str, Any]) -> dict[str, Any]:
            nonlocal pending
            await process.stdin.send(json.dumps(message).encode() + b"\n")  # type: ignore[union-attr]
            if "id" not in message:
                return {}
            while "\n" not in pending:
                pending += await lines.receive()
            line, pending = pending.split("\n", 1)
            answer: dict[str, Any] = json.loads(line)
            return answer

        hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": INFO}
        await request({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello})
        await request({"jsonrpc": "2.0", "method": "notifications/initialized"})
        call = {"name": "spawn_agent", "arguments": {"agent": "sleeper", "input": "x"}}
        spawned = await request({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call})
        task_id = spawned["result"]["structuredContent"]["task_id"]
        process.send_signal(signal.SIGTERM)
        assert await process.wait() == -signal.SIGTERM  # ended as the signal would end it
    async with Client(serve("--store", store)) as client:
        waited = await client.call_tool("wait_agent", {"task_ids": task_id, "timeout_ms": 0})
    [envelope] = structured(waited)["results"]
    assert envelope["status"] == "cancelled"


def _readme_block(language: str, containing: str) -> str:
    blocks = re.findall(rf"```{language}\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    [block] = [block for block in blocks if containing in block]
    return str(block)


async def test_the_readme_host_configuration_serves_the_readme_agents(tmp_path: Path) -> None:
    (tmp_path / "myagents.py").write_text(_readme_block("python", "# myagents.py"))
    entry = json.loads(_readme_block("json", "mcpServers"))["mcpServers"]["subagents"]
    assert entry["command"] == "subagents"  # the console script: here, its module
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "subagents", *entry["args"]], env=ENV, cwd=tmp_path
    )
    async with Client(params) as client:
        task_id = await spawn(client, "researcher", "anyio")
        waited = await client.call_tool("wait_agent", {"task_ids": task_id})
    [envelope] = structured(waited)["results"]
    assert envelope["output"] == "notes on anyio"
    assert (tmp_path / "runs.db").is_file()
