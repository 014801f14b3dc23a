"""OpenTelemetry spans, baggage and metrics: the only module that imports opentelemetry.

Only ``opentelemetry-api`` is used; the SDK and exporters belong to the application. This
module resolves the providers, opens and ends each child's ``invoke_agent`` span and each
tool call's ``execute_tool`` span, carries the context and baggage, and feeds the metric
instruments; what it writes is decided by the pure :mod:`._semconv` (names, attributes)
and :mod:`._metrics` (instruments, points). A manager whose providers record nothing pays
one attribute check per spawn. See ``design/observability.md``.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from time import perf_counter, time_ns
from typing import TYPE_CHECKING, Final, TypeAlias, cast

from opentelemetry import baggage, context, metrics, propagate, trace
from opentelemetry.trace import SpanKind, StatusCode

from . import _metrics, _semconv
from ._envelope import Status
from ._semconv import INSTRUMENTATION, Attributes

if TYPE_CHECKING:
    from opentelemetry.context import Context

    from ._context import RunContext
    from ._envelope import DelegateResult
    from ._record import ChildRecord
    from ._spec import AgentSpec, Request, Result, SubagentConfig

__all__ = [
    "Telemetry",
    "joined",
    "link_reply",
    "link_revival",
    "span_context_of",
    "tool_tracer",
    "trace_carrier",
]

logger = logging.getLogger("subagents.tracing")

_TELEMETRY_KEY: Final = context.create_key("subagents-telemetry")
_EMPTY_CONTEXT: Final = context.Context()

_Record: TypeAlias = Callable[[float, Attributes], None]
"""An instrument's ``record`` (a histogram) or ``add`` (a counter)."""


def _real_tracer(provider: trace.TracerProvider) -> trace.Tracer | None:
    """``provider``'s tracer, or ``None`` for the API's stand-ins when no SDK is installed:
    the no-op tracer, and the proxy that the global provider hands out until one is."""
    tracer = provider.get_tracer(INSTRUMENTATION)
    if isinstance(tracer, (trace.ProxyTracer, trace.NoOpTracer)):
        return None
    return tracer


def _real_meter(provider: object | None) -> metrics.Meter | None:
    """The meter of ``provider`` (default: the global one), or ``None`` when it records
    nothing.

    A provider given explicitly is used, whatever it is, unless it is the no-op one. The
    API gives the global placeholder no public name, so the global provider is used only if
    it has what the specification requires of every SDK ``MeterProvider`` and the
    placeholder lacks: ``force_flush`` and ``shutdown``.
    """
    given = provider is not None
    if not given:
        provider = metrics.get_meter_provider()
    if isinstance(provider, metrics.NoOpMeterProvider):
        return None
    if not given and not (
        callable(getattr(provider, "force_flush", None))
        and callable(getattr(provider, "shutdown", None))
    ):
        return None
    return cast("metrics.MeterProvider", provider).get_meter(INSTRUMENTATION)


def _instruments(meter: metrics.Meter) -> dict[str, _Record]:
    """Every instrument of :data:`._metrics.INSTRUMENTS`, by name, as its recording call."""
    make: dict[str, Callable[[_metrics.Instrument], _Record]] = {
        "histogram": lambda i: (
            meter.create_histogram(
                i.name, i.unit, i.description, explicit_bucket_boundaries_advisory=i.buckets
            ).record
        ),
        "counter": lambda i: meter.create_counter(i.name, i.unit, i.description).add,
        "up_down_counter": lambda i: (
            meter.create_up_down_counter(i.name, i.unit, i.description).add
        ),
    }
    return {i.name: make[i.kind](i) for i in _metrics.INSTRUMENTS}


class _TaskTrace:
    """Per-task tracing state, kept in ``ChildRecord._trace``."""

    __slots__ = (
        "conversation_id",
        "counted",
        "ctx",
        "running",
        "span",
        "span_context",
        "started_at",
        "started_ns",
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
        self.started_ns = 0
        """Wall-clock start (ns since the epoch): where a usage span begins."""
        self.counted = False
        """Whether its start counted it in ``subagents.active`` (undone at its end)."""


class Telemetry:
    """One manager's tracer and metric instruments, and the hooks it calls.

    The providers are resolved once, by :meth:`resolve` (when the manager is entered):
    a provider installed globally after that is not used by this manager.

    Args:
        tracing: ``False`` turns spans and metrics off entirely.
        capture_content: record prompts and outputs on spans (off by default).
        tracer_provider: default: the global one (``opentelemetry.trace``).
        meter_provider: default: the global one (``opentelemetry.metrics``).
        conversation_id: the conversation of the default session's trees; default: one
            made when the manager is entered, unique to that run.
        usage_spans: also give each child that reported tokens a usage span.
    """

    __slots__ = (
        "_conversation_id",
        "_given_conversation_id",
        "_meter_provider",
        "_records",
        "_tracer",
        "_tracer_provider",
        "_tracing",
        "_usage_spans",
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
        conversation_id: str | None = None,
        usage_spans: bool = False,
    ) -> None:
        self.capture_content = capture_content
        self._given_conversation_id = conversation_id
        self._conversation_id = conversation_id or ""
        self._usage_spans = usage_spans
        self._tracing = tracing
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        self._tracer: trace.Tracer | None = None
        self._records: dict[str, _Record] | None = None
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
            conversation_id=config.conversation_id,
            usage_spans=config.usage_spans,
        )

    @property
    def conversation_id(self) -> str:
        """The default session's conversation id (``""`` until :meth:`resolve`)."""
        return self._conversation_id

    def resolve(self) -> None:
        """Get the tracer and the metric instruments, once: the given providers, else
        the global ones. Without an SDK (the API's stand-ins) nothing is recorded and
        :attr:`active` stays false, so a spawn pays one attribute check.

        Also makes this run's conversation id, unless one was given: random, so two
        managers (two runs of one program, or two programs) never share one."""
        self._conversation_id = self._given_conversation_id or secrets.token_hex(16)
        self._clear()
        if not self._tracing:
            return
        try:
            tp = self._tracer_provider
            provider = tp if tp is not None else trace.get_tracer_provider()
            self._tracer = _real_tracer(cast("trace.TracerProvider", provider))
            meter = _real_meter(self._meter_provider)
            if meter is not None:
                self._records = _instruments(meter)
        except Exception:  # a broken provider must not stop the manager: it runs untraced
            logger.exception("resolving the tracer and meter failed; subagents run untraced")
            self._clear()
            return
        self.active = self._tracer is not None or self._records is not None

    def _clear(self) -> None:
        self._tracer = None
        self._records = None
        self.active = False

    def _record(self, points: Iterable[_metrics.Point]) -> None:
        records = self._records
        if records is not None:
            for name, value, attributes in points:
                records[name](value, attributes)

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
            conversation_id = _semconv.conversation_of(record.root_session, self._conversation_id)
        span: trace.Span | None = None
        ctx = captured
        if self._tracer is not None:
            span = self._tracer.start_span(
                f"invoke_agent {record.spec.name}",
                context=captured,
                kind=SpanKind.INTERNAL,
                attributes=_semconv.child_attributes(
                    record, conversation_id, capture_content=self.capture_content
                ),
            )
            ctx = trace.set_span_in_context(span, captured)
        ctx = baggage.set_baggage(_semconv.BAGGAGE_CONVERSATION_ID, conversation_id, ctx)
        ctx = baggage.set_baggage(_semconv.BAGGAGE_AGENT_PATH, str(record.agent_path), ctx)
        ctx = baggage.set_baggage(_semconv.BAGGAGE_TASK_ID, record.task_id, ctx)
        ctx = context.set_value(_TELEMETRY_KEY, self, ctx)
        return _TaskTrace(span, ctx, conversation_id)

    def queued(self, record: ChildRecord) -> None:
        """A spawn entered the queue. Never raises."""
        state = record.trace
        if isinstance(state, _TaskTrace) and state.span is not None:
            try:
                state.span.add_event(
                    _semconv.EVENT_QUEUED, {"subagents.queue_position": record.queue_position}
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
        state.started_ns = time_ns()
        queue_s = 0.0 if record.started_at is None else record.started_at - record.spawned_at
        if state.span is not None:
            state.span.add_event(_semconv.EVENT_STARTED)
            state.span.set_attribute("subagents.queue_ms", int(queue_s * 1000))
        if self._records is not None:
            state.counted = True
            self._record(_metrics.start_points(record.spec.name, None if record.sync else queue_s))

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
        span = state.span
        if span is not None:
            state.span = None  # the manager keeps handles; do not keep ended spans alive
            if self._usage_spans and envelope.usage:
                self._usage_span(span, record, state, envelope)
            self._end_span(span, record, envelope)
        state.ctx = _EMPTY_CONTEXT
        if self._records is not None:
            if state.running:
                elapsed = perf_counter() - state.started_at
            else:
                elapsed = envelope.duration_ms / 1000
            spec = record.spec
            operation = _metrics.operation_attributes(
                spec.name, spec.provider, _semconv.child_model(record)
            )
            counted, state.counted = state.counted, False
            self._record(_metrics.end_points(envelope, operation, elapsed=elapsed, counted=counted))
        state.running = False

    def _usage_span(
        self, parent: trace.Span, record: ChildRecord, state: _TaskTrace, envelope: DelegateResult
    ) -> None:
        """The child's own tokens in a span LLM tracing UIs count, under its span."""
        assert self._tracer is not None
        attributes = _semconv.usage_attributes(
            envelope,
            provider=record.spec.provider,
            model=_semconv.child_model(record),
            conversation_id=state.conversation_id,
        )
        end = time_ns()
        self._tracer.start_span(
            f"{_semconv.USAGE_SPAN_PREFIX} {record.spec.name}",
            context=trace.set_span_in_context(parent),
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=state.started_ns or end,
        ).end(end_time=end)

    def _end_span(self, span: trace.Span, record: ChildRecord, envelope: DelegateResult) -> None:
        span.set_attributes(_semconv.end_attributes(envelope, capture_content=self.capture_content))
        if envelope.status is Status.TIMEOUT:
            span.add_event(_semconv.EVENT_WATCHDOG, {"subagents.timeout_s": record.timeout or 0.0})
            span.set_status(StatusCode.ERROR, envelope.error)
        elif envelope.status is Status.ERROR:
            span.add_event(_semconv.EVENT_EXCEPTION, _semconv.exception_attributes(envelope))
            span.set_status(StatusCode.ERROR, envelope.error)
        span.end()


def tool_tracer(telemetry: Telemetry | None, current: Context) -> trace.Tracer | None:
    """The tracer of a tool call: ``telemetry``'s; without one, that of the manager whose
    child is running (found in ``current``), else the global provider's."""
    if telemetry is None:
        found = context.get_value(_TELEMETRY_KEY, current)
        if not isinstance(found, Telemetry):
            return _real_tracer(trace.get_tracer_provider())
        telemetry = found
    return telemetry._tracer


def span_context_of(record: ChildRecord) -> trace.SpanContext | None:
    """The context of ``record``'s ``invoke_agent`` span (kept after it ended), if traced."""
    state = record.trace
    return state.span_context if isinstance(state, _TaskTrace) else None


def link_reply(replier: ChildRecord | None, asker: ChildRecord | None, reply: str, to: str) -> None:
    """A reply (message ``reply``, answering ``to``) sent through the Python API: the
    replier's span (its ``invoke_agent`` while it runs; a host's current span) links to
    the ``invoke_agent`` span of the agent whose message it answers. Never raises."""
    target = None if asker is None else span_context_of(asker)
    if asker is None or target is None:
        return
    state = None if replier is None else replier.trace
    span = state.span if isinstance(state, _TaskTrace) else None
    if span is None and replier is None:
        span = trace.get_current_span()
    link = {"subagents.task_id": asker.task_id, "subagents.message_id": reply}
    try:
        if span is not None and span.is_recording():
            span.add_link(target, {**link, "subagents.reply_to": to})
    except Exception:
        logger.exception("linking the reply %s to its question failed", reply)


def link_revival(follow_up: ChildRecord, previous: ChildRecord) -> None:
    """A follow-up run's ``invoke_agent`` span links to the ended run's it revives.
    Never raises."""
    state, target = follow_up.trace, span_context_of(previous)
    span = state.span if isinstance(state, _TaskTrace) else None
    if span is None or target is None:
        return
    try:
        span.add_link(target, {"subagents.task_id": previous.task_id, "subagents.revived": True})
    except Exception:
        logger.exception("linking task %s to the run it revives failed", follow_up.task_id)


def trace_carrier() -> dict[str, str]:
    """The current trace context and baggage as W3C headers, for a run in another process."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


@contextmanager
def joined(carrier: Mapping[str, str]) -> Iterator[None]:
    """Run the block in the context ``carrier`` holds: its spans join that trace."""
    token = context.attach(propagate.extract(carrier))
    try:
        yield
    finally:
        context.detach(token)
