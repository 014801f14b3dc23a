"""OpenTelemetry spans, baggage and metrics: the only module that imports opentelemetry.

Only ``opentelemetry-api`` is used; the SDK and exporters belong to the application. The
conventions are the OpenTelemetry GenAI agent spans (``invoke_agent {agent}``,
``execute_tool {tool}``, ``gen_ai.agent.*``, ``gen_ai.usage.*``) and metrics
(``gen_ai.client.operation.duration``, ``gen_ai.client.token.usage``); what they do not
define is named under ``subagents.``, and the deprecated ``gen_ai.system`` is never
written. See ``design/observability.md``.

Cost: a :class:`Telemetry` decides once, when the manager is entered, whether its tracer
and meter record anything: the providers given in ``SubagentConfig``, else the global ones,
through ``get_tracer`` / ``get_meter`` and public checks only (the API's proxy and no-op
tracers, and a global meter provider without the SDK's ``force_flush`` / ``shutdown``,
record nothing). When neither does, or ``SubagentConfig.tracing`` is off,
:meth:`Telemetry.start` is never called and a spawn pays one attribute check; no span,
context or dict is created.

Context: the caller's OpenTelemetry context is captured when ``spawn`` is called and
attached around the child's runner, so the child's ``invoke_agent`` span is a child of the
span that was current at spawn time, although the child runs in the manager's worker task
group (whose inherited context belongs to whoever started the worker).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from time import perf_counter
from typing import TYPE_CHECKING, Final, cast

from opentelemetry import baggage, context, metrics, trace
from opentelemetry.trace import SpanKind, StatusCode

from ._handle import record_of
from ._json import dumps_str

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.util.types import AttributeValue

    from ._context import RunContext
    from ._envelope import DelegateResult
    from ._handle import SpawnHandle
    from ._record import ChildRecord
    from ._spec import AgentSpec, Request, Result, SubagentConfig

__all__ = [
    "BAGGAGE_AGENT_PATH",
    "BAGGAGE_CONVERSATION_ID",
    "BAGGAGE_TASK_ID",
    "DEFAULT_PROVIDER",
    "TOOL_CONTENT_LIMIT",
    "Telemetry",
    "ToolSpan",
    "tool_span",
]

INSTRUMENTATION: Final = "subagents"
logger = logging.getLogger("subagents.tracing")

BAGGAGE_CONVERSATION_ID: Final = "gen_ai.conversation.id"
"""Baggage key: the root session id shared by the whole delegation tree."""
BAGGAGE_AGENT_PATH: Final = "subagents.agent_path"
"""Baggage key: the running child's agent path."""
BAGGAGE_TASK_ID: Final = "subagents.task_id"
"""Baggage key: the running child's task id."""

DEFAULT_PROVIDER: Final = "subagents"
"""``gen_ai.provider.name`` when ``AgentSpec.provider`` is not given. The attribute is
Required on ``invoke_agent`` and its metrics; its well-known values name model vendors, and a
custom value is allowed when none applies: a runner may be any callable, so what the library
knows for certain is that the subagents runtime invoked the agent."""
TOOL_CONTENT_LIMIT: Final = 4096
"""Bound (characters) of ``gen_ai.tool.call.arguments`` / ``.result``; a cut value ends in
an ellipsis (and is no longer valid JSON)."""

# The bucket boundaries the GenAI metric conventions advise for these two histograms.
_DURATION_BUCKETS: Final = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
_TOKEN_BUCKETS: Final = tuple(float(4**i) for i in range(14))

EVENT_QUEUED: Final = "queued"
EVENT_STARTED: Final = "started"
EVENT_WATCHDOG: Final = "watchdog.fired"

_TELEMETRY_KEY: Final = context.create_key("subagents-telemetry")
_EMPTY_CONTEXT: Final = context.Context()


def _real_tracer(provider: trace.TracerProvider) -> trace.Tracer | None:
    """``provider``'s tracer, or ``None`` for the API's stand-ins when no SDK is installed:
    the no-op tracer, and the proxy that the global provider hands out until one is."""
    tracer = provider.get_tracer(INSTRUMENTATION)
    if isinstance(tracer, (trace.ProxyTracer, trace.NoOpTracer)):
        return None
    return tracer


def _is_sdk_meter_provider(provider: object) -> bool:
    """Whether the global meter provider is an implementation rather than the API's
    placeholder.

    The API gives its placeholder no public name, so this asks what the specification
    requires of every SDK ``MeterProvider`` and the placeholder lacks: ``force_flush`` and
    ``shutdown``.
    """
    if isinstance(provider, metrics.NoOpMeterProvider):
        return False
    return callable(getattr(provider, "force_flush", None)) and callable(
        getattr(provider, "shutdown", None)
    )


class _TaskTrace:
    """Per-task tracing state, kept in ``ChildRecord._trace``."""

    __slots__ = (
        "active_count",
        "conversation_id",
        "ctx",
        "running",
        "span",
        "span_context",
        "started_at",
    )

    def __init__(self, span: trace.Span | None, ctx: Context, conversation_id: str) -> None:
        self.span = span
        # Outlives the span (wait_agent links to it after the child ended); the record
        # holding it is the manager's, so the bookkeeping is per manager.
        self.span_context = span.get_span_context() if span is not None else None
        self.ctx = ctx
        self.conversation_id = conversation_id
        self.running = False
        self.started_at = 0.0
        self.active_count: metrics.UpDownCounter | None = None  # incremented at start


class Telemetry:
    """One manager's tracer and metric instruments, and the hooks it calls.

    The providers are resolved once, by :meth:`resolve` (when the manager is entered):
    a provider installed globally after that is not used by this manager.

    Args:
        tracing: ``False`` turns spans and metrics off entirely.
        capture_content: record prompts and outputs on spans (off by default).
        tracer_provider: default: the global one (``opentelemetry.trace``).
        meter_provider: default: the global one (``opentelemetry.metrics``).
    """

    __slots__ = (
        "_active_count",
        "_duration",
        "_meter_provider",
        "_queue_wait",
        "_tokens",
        "_tracer",
        "_tracer_provider",
        "_tracing",
        "_watchdog",
        "active",
        "capture_content",
    )

    def __init__(
        self,
        *,
        tracing: bool = True,
        capture_content: bool = False,
        tracer_provider: object | None = None,
        meter_provider: object | None = None,
    ) -> None:
        self.capture_content = capture_content
        self._tracing = tracing
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        self._tracer: trace.Tracer | None = None
        self._duration: metrics.Histogram | None = None
        self._tokens: metrics.Histogram | None = None
        self._active_count: metrics.UpDownCounter | None = None
        self._queue_wait: metrics.Histogram | None = None
        self._watchdog: metrics.Counter | None = None
        self.active = False
        """True when spans or metrics are recorded (the manager skips every hook otherwise)."""

    @classmethod
    def from_config(cls, config: SubagentConfig) -> Telemetry:
        """Build from ``config.tracing``, ``config.capture_content`` and the providers."""
        return cls(
            tracing=config.tracing,
            capture_content=config.capture_content,
            tracer_provider=config.tracer_provider,
            meter_provider=config.meter_provider,
        )

    def resolve(self) -> None:
        """Get the tracer and the metric instruments, once: the given providers, else
        the global ones. Without an SDK (the API's stand-ins) nothing is recorded and
        :attr:`active` stays false, so a spawn pays one attribute check."""
        self._clear()
        if not self._tracing:
            return
        try:
            self._resolve()
        except Exception:  # a broken provider must not stop the manager: it runs untraced
            logger.exception("resolving the tracer and meter failed; subagents run untraced")
            self._clear()
            return
        self.active = self._tracer is not None or self._duration is not None

    def _clear(self) -> None:
        self._tracer = None
        self._duration = self._tokens = None
        self._active_count = self._queue_wait = self._watchdog = None
        self.active = False

    def _resolve(self) -> None:
        tp = self._tracer_provider
        tracer_provider = cast(
            "trace.TracerProvider", tp if tp is not None else trace.get_tracer_provider()
        )
        self._tracer = _real_tracer(tracer_provider)
        mp = self._meter_provider
        if mp is None:
            mp = metrics.get_meter_provider()
            real_meter = _is_sdk_meter_provider(mp)
        else:  # given explicitly: used, whatever it is, unless it is the no-op one
            real_meter = not isinstance(mp, metrics.NoOpMeterProvider)
        if real_meter:
            meter = cast("metrics.MeterProvider", mp).get_meter(INSTRUMENTATION)
            self._duration = meter.create_histogram(
                "gen_ai.client.operation.duration",
                unit="s",
                description="GenAI operation duration: the run time of a subagent "
                "(gen_ai.operation.name=invoke_agent, from its start, queue excluded).",
                explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
            )
            self._tokens = meter.create_histogram(
                "gen_ai.client.token.usage",
                unit="{token}",
                description="Number of input and output tokens a subagent reported.",
                explicit_bucket_boundaries_advisory=_TOKEN_BUCKETS,
            )
            self._active_count = meter.create_up_down_counter(
                "subagents.active", unit="{agent}", description="Subagents running now."
            )
            self._queue_wait = meter.create_histogram(
                "subagents.queue.wait",
                unit="s",
                description="Time a spawned subagent waited for a concurrency slot.",
            )
            self._watchdog = meter.create_counter(
                "subagents.watchdog.fired",
                unit="{agent}",
                description="Subagents stopped by their watchdog.",
            )

    # ----------------------------------------------------------------- manager hooks

    def start(self, record: ChildRecord, parent: ChildRecord | None) -> _TaskTrace | None:
        """At spawn time, in the caller's task: capture its context and open the span.

        Never raises: if the tracing machinery fails, the task runs untraced.
        """
        try:
            return self._start(record, parent)
        except Exception:
            logger.exception(
                "tracing the spawn of task %s failed; it runs untraced", record.task_id
            )
            return None

    def _start(self, record: ChildRecord, parent: ChildRecord | None) -> _TaskTrace:
        captured = context.get_current()
        parent_trace = parent.trace if parent is not None else None
        if isinstance(parent_trace, _TaskTrace):
            conversation_id = parent_trace.conversation_id
        else:
            conversation_id = _root_session(record)
        span: trace.Span | None = None
        ctx = captured
        if self._tracer is not None:
            spec = record.spec
            request = record.request
            attributes: dict[str, AttributeValue] = {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": spec.name,
                "gen_ai.agent.id": record.task_id,
                "gen_ai.agent.description": spec.description,
                "gen_ai.conversation.id": conversation_id,
                "subagents.task_id": record.task_id,
                "subagents.agent_path": str(record.agent_path),
                "subagents.parent_path": str(record.parent_path),
                "subagents.session_id": record.session_id,
                "subagents.mode": "execute" if record.sync else "spawn",
            }
            attributes["gen_ai.provider.name"] = spec.provider or DEFAULT_PROVIDER
            model = request.model if request.model is not None else spec.model
            if model:
                attributes["gen_ai.request.model"] = model
            if self.capture_content:
                _content_attributes(attributes, request)
            span = self._tracer.start_span(
                f"invoke_agent {spec.name}",
                context=captured,
                kind=SpanKind.INTERNAL,
                attributes=attributes,
            )
            ctx = trace.set_span_in_context(span, captured)
        ctx = baggage.set_baggage(BAGGAGE_CONVERSATION_ID, conversation_id, ctx)
        ctx = baggage.set_baggage(BAGGAGE_AGENT_PATH, str(record.agent_path), ctx)
        ctx = baggage.set_baggage(BAGGAGE_TASK_ID, record.task_id, ctx)
        ctx = context.set_value(_TELEMETRY_KEY, self, ctx)
        return _TaskTrace(span, ctx, conversation_id)

    def queued(self, record: ChildRecord) -> None:
        """A spawn entered the queue. Never raises."""
        state = record.trace
        if isinstance(state, _TaskTrace) and state.span is not None:
            try:
                state.span.add_event(
                    EVENT_QUEUED, {"subagents.queue_position": record.queue_position}
                )
            except Exception:
                logger.exception("tracing the queueing of task %s failed", record.task_id)

    async def run(
        self,
        backend: Callable[[AgentSpec, Request, RunContext], Awaitable[Result]],
        record: ChildRecord,
        ctx: RunContext,
    ) -> Result:
        """Run ``backend`` for ``record`` with the spawn-time context attached."""
        state = record.trace
        assert isinstance(state, _TaskTrace)
        try:
            self._started(record, state)
        except Exception:
            logger.exception("tracing the start of task %s failed", record.task_id)
        token = context.attach(state.ctx)
        try:
            return await backend(record.spec, record.request, ctx)
        finally:
            context.detach(token)

    def _started(self, record: ChildRecord, state: _TaskTrace) -> None:
        state.running = True
        state.started_at = perf_counter()
        queue_s = 0.0 if record.started_at is None else record.started_at - record.spawned_at
        if state.span is not None:
            state.span.add_event(EVENT_STARTED)
            state.span.set_attribute("subagents.queue_ms", int(queue_s * 1000))
        if self._active_count is not None:
            agent = {"gen_ai.agent.name": record.spec.name}
            state.active_count = self._active_count
            self._active_count.add(1, agent)
            if self._queue_wait is not None and not record.sync:
                self._queue_wait.record(max(queue_s, 0.0), agent)

    def finish(self, record: ChildRecord, envelope: DelegateResult) -> None:
        """The one envelope of ``record`` exists: close the span, record the metrics.

        Never raises (it runs on the delivery path of the envelope).
        """
        state = record.trace
        if not isinstance(state, _TaskTrace):
            return
        try:
            self._finish(record, state, envelope)
        except Exception:
            logger.exception("tracing the end of task %s failed", record.task_id)

    def _finish(self, record: ChildRecord, state: _TaskTrace, envelope: DelegateResult) -> None:
        status = envelope.status.value
        failed = status != "completed"
        error_type = (envelope.error_type or status) if failed else ""
        span = state.span
        if span is not None:
            usage = envelope.usage
            attributes: dict[str, AttributeValue] = {
                "gen_ai.usage.input_tokens": usage.input_tokens,
                "gen_ai.usage.output_tokens": usage.output_tokens,
                "subagents.status": status,
                "subagents.iterations": envelope.iterations,
                "subagents.queue_ms": envelope.queue_ms,
            }
            if envelope.attempts != 1:
                attributes["subagents.attempts"] = envelope.attempts
            if failed:
                attributes["error.type"] = error_type
            if self.capture_content and envelope.output:
                attributes["gen_ai.output.messages"] = dumps_str(
                    [
                        {
                            "role": "assistant",
                            "parts": [{"type": "text", "content": envelope.output}],
                        }
                    ]
                )
            span.set_attributes(attributes)
            if status == "timeout":
                span.add_event(EVENT_WATCHDOG, {"subagents.timeout_s": record.timeout or 0.0})
                span.set_status(StatusCode.ERROR, envelope.error)
            elif status == "error":
                span.add_event(
                    "exception",
                    {"exception.type": error_type, "exception.message": envelope.error},
                )
                span.set_status(StatusCode.ERROR, envelope.error)
            span.end()
            state.span = None  # the manager keeps handles; do not keep ended spans alive
        state.ctx = _EMPTY_CONTEXT
        agent = {"gen_ai.agent.name": record.spec.name}
        if state.active_count is not None:
            state.active_count.add(-1, agent)
            state.active_count = None
        if self._duration is not None:
            if state.running:
                elapsed = perf_counter() - state.started_at
            else:
                elapsed = envelope.duration_ms / 1000
            attrs = _metric_attributes(record)
            usage = envelope.usage
            if self._tokens is not None and (usage.input_tokens or usage.output_tokens):
                for token_type, count in (
                    ("input", usage.input_tokens),
                    ("output", usage.output_tokens),
                ):
                    self._tokens.record(count, {**attrs, "gen_ai.token.type": token_type})
            if failed:
                attrs["error.type"] = error_type
            self._duration.record(elapsed, attrs)
            if status == "timeout" and self._watchdog is not None:
                self._watchdog.add(1, agent)
        state.running = False


def _root_session(record: ChildRecord) -> str:
    """The session at the top of ``record``'s tree (a child's session is its task id)."""
    return record.root_session


def _metric_attributes(record: ChildRecord) -> dict[str, AttributeValue]:
    spec = record.spec
    request = record.request
    attrs: dict[str, AttributeValue] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.provider.name": spec.provider or DEFAULT_PROVIDER,
        "gen_ai.agent.name": spec.name,
    }
    model = request.model if request.model is not None else spec.model
    if model:
        attrs["gen_ai.request.model"] = model
    return attrs


def _content_attributes(attributes: dict[str, AttributeValue], request: Request) -> None:
    if request.prompt:
        attributes["gen_ai.system_instructions"] = dumps_str(
            [{"type": "text", "content": request.prompt}]
        )
    attributes["gen_ai.input.messages"] = dumps_str(
        [{"role": "user", "parts": [{"type": "text", "content": request.input}]}]
    )


# --------------------------------------------------------------------- tool spans

_global_tracer_cache: list[object] = [None, None]  # [provider, tracer]


def _global_tracer() -> trace.Tracer | None:
    """The global provider's tracer (``None`` without an SDK), looked up again only when
    the global provider changes."""
    provider = trace.get_tracer_provider()
    cache = _global_tracer_cache
    if cache[0] is provider:
        tracer = cache[1]
        return tracer if isinstance(tracer, trace.Tracer) else None
    tracer = _real_tracer(provider)
    cache[0], cache[1] = provider, tracer
    return tracer


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

    def set_result(self, text: str) -> None:
        """Record a successful call's result as ``gen_ai.tool.call.result``, bounded to
        :data:`TOOL_CONTENT_LIMIT` (callers pass it only under ``capture_content``)."""
        if self._span is not None:
            self._span.set_attribute("gen_ai.tool.call.result", _bounded(text))

    def link_tasks(self, handles: Iterable[SpawnHandle]) -> None:
        """Link this span to the ``invoke_agent`` spans of the given children.

        Children that were not traced are skipped.
        """
        span = self._span
        if span is None:
            return
        for handle in handles:
            state = record_of(handle).trace
            if isinstance(state, _TaskTrace) and state.span_context is not None:
                span.add_link(state.span_context, {"subagents.task_id": handle.task_id})


_NO_TOOL_SPAN: Final = ToolSpan()


@contextmanager
def tool_span(
    tool: str,
    *,
    call_id: str | None = None,
    transfer_target: str | None = None,
    description: str | None = None,
    arguments: str | None = None,
) -> Iterator[ToolSpan]:
    """Wrap one tool execution in an ``execute_tool {tool}`` span (kind INTERNAL).

    The span is current inside the block, so a child spawned there is its child. Inside a
    subagent the tracer is its manager's (honouring ``SubagentConfig.tracing``); elsewhere
    the global provider's. An exception escaping the block is recorded and sets status
    ERROR; cancellation is not an error.

    Args:
        tool: the tool's name.
        call_id: the host's tool-call id, when it passes one.
        transfer_target: for spawn/delegate, the target agent's name.
        description: the tool's description (``gen_ai.tool.description``).
        arguments: the call's arguments as JSON text, recorded (bounded) as
            ``gen_ai.tool.call.arguments``; pass them only under ``capture_content``.
    """
    current = context.get_current()
    telemetry = context.get_value(_TELEMETRY_KEY, current)
    tracer = telemetry._tracer if isinstance(telemetry, Telemetry) else _global_tracer()
    if tracer is None:
        yield _NO_TOOL_SPAN
        return
    # Names and ids may come from a model (an unknown tool, a made-up agent): bounded, so a
    # span's name and attributes never grow with what a model sends.
    tool = _bounded_name(tool)
    attributes: dict[str, AttributeValue] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool,
        "gen_ai.tool.type": "function",
    }
    if call_id:
        attributes["gen_ai.tool.call.id"] = _bounded_name(call_id)
    if description:
        attributes["gen_ai.tool.description"] = description
    if arguments is not None:
        attributes["gen_ai.tool.call.arguments"] = _bounded(arguments)
    if transfer_target:
        # The GenAI conventions' transfer attributes (gen_ai.transfer.*) exist only in an
        # in-development refinement of execute_tool, so these stay in our namespace.
        attributes["subagents.transfer.mode"] = "return_to_caller"
        attributes["subagents.transfer.target.name"] = _bounded_name(transfer_target)
        attributes["subagents.transfer.target.type"] = "agent"
    conversation_id = baggage.get_baggage(BAGGAGE_CONVERSATION_ID, current)
    if isinstance(conversation_id, str):
        attributes["gen_ai.conversation.id"] = conversation_id
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
            span.set_attribute("error.type", _qualified_name(exc))
            span.set_status(StatusCode.ERROR, str(exc) or None)
            raise


_NAME_LIMIT: Final = 128  # characters of a tool, agent or call id name in a span


def _bounded_name(name: str) -> str:
    return name if len(name) <= _NAME_LIMIT else name[: _NAME_LIMIT - 1] + "…"


def _bounded(text: str) -> str:
    if len(text) <= TOOL_CONTENT_LIMIT:
        return text
    return text[: TOOL_CONTENT_LIMIT - 1] + "…"


def _qualified_name(exc: BaseException) -> str:
    cls = type(exc)
    if cls.__module__ in ("builtins", "__main__"):
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"
