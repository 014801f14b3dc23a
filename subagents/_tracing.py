"""OpenTelemetry spans and metrics: the only module that imports opentelemetry.

(Stub: the observability work fills this in; the signatures below are the seam the
manager and the tools call.)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

__all__ = ["ToolSpan", "tool_span"]


class ToolSpan:
    """The span of one tool call, as the tools see it."""

    def set_attribute(self, key: str, value: str | int | float | bool) -> None:
        """Attach an attribute to the span (no-op without tracing)."""

    def link_tasks(self, task_ids: Iterable[str]) -> None:
        """Link this span to the ``invoke_agent`` spans of the given tasks."""


@contextmanager
def tool_span(
    tool: str,
    *,
    call_id: str | None = None,
    transfer_target: str | None = None,
) -> Iterator[ToolSpan]:
    """Wrap one tool execution in an ``execute_tool {tool}`` span.

    Args:
        tool: the tool's name.
        call_id: the host's tool-call id, when it passes one.
        transfer_target: for spawn/delegate, the target agent's name.
    """
    yield ToolSpan()
