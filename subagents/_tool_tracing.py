"""The ``execute_tool`` span of one tool call (:func:`tool_span`) and what the tools
see of it (:class:`ToolSpan`). With :mod:`._tracing`, the only modules that import
opentelemetry: this one holds the tools' side so that one stays one job (a child's spans
and the metrics). See ``design/observability.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Final

from opentelemetry import baggage, context, trace
from opentelemetry.trace import SpanKind, StatusCode

from . import _semconv
from ._handle import record_of
from ._json import dumps_str
from ._tracing import span_context_of, tool_tracer

if TYPE_CHECKING:
    from ._handle import SpawnHandle
    from ._json import JSONValue
    from ._tracing import Telemetry

__all__ = ["ToolSpan", "tool_span"]

logger = logging.getLogger("subagents.tracing")


class ToolSpan:
    """The span of one tool call, as the tools see it.

    Without tracing every method is a no-op, so tools call them unconditionally.
    """

    __slots__ = ("_span",)

    def __init__(self, span: trace.Span | None = None) -> None:
        self._span = span

    @property
    def recording(self) -> bool:
        """True when a real span records what is set on it."""
        return self._span is not None and self._span.is_recording()

    def set_attribute(self, key: str, value: str | int | float | bool) -> None:
        """Attach an attribute to the span (no-op without tracing)."""
        if self._span is not None:
            self._span.set_attribute(key, value)

    def set_error(self, error_type: str, message: str = "") -> None:
        """Mark the call failed (an error returned to the model as data)."""
        if self._span is not None:
            self._span.set_attribute("error.type", error_type)
            self._span.set_status(StatusCode.ERROR, message or None)

    def set_result(self, text: str, *, failed: bool = False) -> None:
        """Record what the call answered, bounded to :data:`._semconv.TOOL_CONTENT_LIMIT`:
        as ``gen_ai.tool.call.result`` unless it ``failed``, and as ``output.value``
        (callers pass it only under ``capture_content``)."""
        if self._span is not None:
            self._span.set_attributes(_semconv.tool_result_attributes(text, failed=failed))

    def link_tasks(self, handles: Iterable[SpawnHandle]) -> None:
        """Link this span to the ``invoke_agent`` spans of the given children.

        Children that were not traced are skipped.
        """
        span = self._span
        if span is None:
            return
        for handle in handles:
            target = span_context_of(record_of(handle))
            if target is not None:
                span.add_link(target, {"subagents.task_id": handle.task_id})


_NO_TOOL_SPAN: Final = ToolSpan()


@contextmanager
def tool_span(
    tool: str,
    *,
    call_id: str | None = None,
    transfer_target: str | None = None,
    description: str | None = None,
    arguments: str | None = None,
    parameters: Mapping[str, JSONValue] | None = None,
    telemetry: Telemetry | None = None,
    conversation_id: str | None = None,
) -> Iterator[ToolSpan]:
    """Wrap one tool execution in an ``execute_tool {tool}`` span (kind INTERNAL).

    The span is current inside the block, so a child spawned there is its child. The
    tracer is that of the manager the tool acts on (``telemetry``, honouring its
    ``SubagentConfig``: its providers, and no span with ``tracing=False``); without one,
    inside a subagent its manager's, elsewhere the global provider's. An exception
    escaping the block is recorded and sets status ERROR; cancellation is not an error.

    Args:
        tool: the tool's name.
        call_id: the host's tool-call id, when it passes one.
        transfer_target: for spawn/delegate, the target agent's name.
        description: the tool's description (``gen_ai.tool.description``).
        arguments: the call's arguments as JSON text, recorded (bounded) as
            ``gen_ai.tool.call.arguments``; pass them only under ``capture_content``.
        parameters: the tool's input JSON Schema (``tool.parameters``, encoded only when
            the span records).
        telemetry: the telemetry of the manager the tool acts on.
        conversation_id: the span's conversation where no subagent's baggage names one.
    """
    current = context.get_current()
    tracer = tool_tracer(telemetry, current)
    if tracer is None:
        yield _NO_TOOL_SPAN
        return
    tool = _semconv.bounded_name(tool)  # it may come from a model: an unknown tool
    found = baggage.get_baggage(_semconv.BAGGAGE_CONVERSATION_ID, current)
    attributes = _semconv.tool_attributes(
        tool,
        call_id=call_id,
        description=description,
        arguments=arguments,
        transfer_target=transfer_target,
        conversation_id=found if isinstance(found, str) and found else conversation_id,
        parameters=None if parameters is None else dumps_str(parameters),
    )
    with tracer.start_as_current_span(
        f"execute_tool {tool}",
        kind=SpanKind.INTERNAL,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield ToolSpan(span)
        except Exception as exc:
            span.record_exception(exc)
            span.set_attribute("error.type", _semconv.qualified_name(exc))
            span.set_status(StatusCode.ERROR, str(exc) or None)
            raise
