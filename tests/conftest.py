"""Shared fixtures: every async test runs on asyncio and on trio (anyio's plugin)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from subagents.tools import Tool, ToolResult
from subagents.typing import JSONValue
from tests.otel_support import Otel
from tests.schema_check import details_problems


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def otel() -> Iterator[Otel]:
    """OpenTelemetry SDK providers with in-memory export, for one test's manager
    (``otel.install(manager)``), shut down after it."""
    setup = Otel()
    yield setup
    setup.shutdown()


@pytest.fixture(autouse=True)
def _details_match_output_schemas(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every tool call of every test answers with ``details`` its output schema accepts:
    MCP clients validate ``structuredContent`` against it. Checked after the test, so the
    check never slows a call down against a host timeout."""
    original = Tool.execute
    seen: list[tuple[Tool, dict[str, JSONValue]]] = []

    async def execute(self: Tool, args: object, *, call_id: str | None = None) -> ToolResult:
        result = await original(self, args, call_id=call_id)
        seen.append((self, result.details))
        return result

    monkeypatch.setattr(Tool, "execute", execute)
    yield
    problems = [p for tool, details in seen for p in details_problems(tool, details)]
    assert not problems, problems[:5]
