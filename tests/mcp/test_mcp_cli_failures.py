"""``subagents mcp serve`` failing in a real subprocess: every failure of the command is
one line on stderr and a non-zero status, never a traceback, and an option the user gave
is never dropped silently. Each case runs the command with stdin closed, so a server
that did start would end at once (status 0)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
AGENTS = ["--agents", "tests.mcp.agents:SPECS"]
ENV = {
    "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    "PYTHONWARNINGS": "error",
}
_UVICORN_LOG = re.compile(r"^(INFO|WARNING|ERROR):\s")


def _serve(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "subagents", "mcp", "serve", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **ENV},
        timeout=120,
        check=False,
    )


def _assert_one_line_failure(run: subprocess.CompletedProcess[str], *naming: str) -> None:
    assert "Traceback" not in run.stderr, run.stderr
    assert run.returncode != 0, run.stderr
    # uvicorn's own log lines (streamable HTTP) may stay; the command adds one of its own.
    lines = [line for line in run.stderr.splitlines() if not _UVICORN_LOG.match(line)]
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("subagents mcp serve: "), run.stderr
    for word in naming:
        assert word in lines[0], run.stderr


def test_an_empty_session_is_a_one_line_error_naming_it() -> None:
    # build_server's ConfigError is raised inside the command's task group: it reaches
    # main() wrapped in an ExceptionGroup, which `except SubagentsError` alone misses.
    _assert_one_line_failure(_serve(*AGENTS, "--session", ""), "session")


@pytest.mark.parametrize("port", ["99999", "-5"])
def test_a_port_out_of_range_is_a_one_line_error_naming_it(port: str) -> None:
    run = _serve(*AGENTS, "--transport", "streamable-http", "--port", port)
    _assert_one_line_failure(run, "port")


def test_a_port_in_use_is_a_one_line_error() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        run = _serve(*AGENTS, "--transport", "streamable-http", "--port", port)
    _assert_one_line_failure(run, port)


def test_an_empty_store_path_is_refused_not_dropped() -> None:
    # SubagentConfig(store_path="") is a ConfigError; a command that reads an empty
    # `--store` as "no store" runs a host config whose store path came out empty without
    # durability, and says nothing.
    _assert_one_line_failure(_serve(*AGENTS, "--store", ""), "store")


def test_an_async_factory_is_a_one_line_error(tmp_path: Path) -> None:
    (tmp_path / "asyncagents.py").write_text(
        "from subagents.testing import echo_agent\n\n\n"
        "async def make():\n"
        "    return [echo_agent()]\n"
    )
    # The factory's coroutine is never awaited: its RuntimeWarning (an error under
    # PYTHONWARNINGS=error, as in this project) must not print a traceback after the
    # error line.
    _assert_one_line_failure(_serve("--agents", "asyncagents:make", cwd=tmp_path), "make")
