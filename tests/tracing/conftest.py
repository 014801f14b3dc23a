"""The tracing tests' exporter.

The global tracer provider can be set only once per process, so each module installs an
SDK provider if none is set (and unsets it again afterwards), or reuses the SDK one another
module installed, and adds a gated in-memory exporter that only records while its tests
run.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


class _Gate(SpanProcessor):
    """Forwards ended spans to the exporter only while open."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        self.exporter = exporter
        self.open = False

    def on_start(self, span: object, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if self.open:
            self.exporter.export([span])

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _reset_global_tracer_provider() -> None:
    # private: OpenTelemetry has no public way to unset the global provider (the API
    # allows setting it once). This is what its own test utilities do, so that a later
    # test module can install its own.
    from opentelemetry.util._once import Once

    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def _gate() -> Iterator[_Gate]:
    installed_here = isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    if installed_here:
        trace.set_tracer_provider(TracerProvider())
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # pragma: no cover - foreign provider
        pytest.skip("a non-SDK tracer provider is installed globally")
    gate = _Gate(InMemorySpanExporter())
    provider.add_span_processor(gate)
    gate.open = True
    yield gate
    gate.open = False
    gate.exporter.clear()
    if installed_here:
        _reset_global_tracer_provider()


@pytest.fixture
def exporter(_gate: _Gate) -> InMemorySpanExporter:
    _gate.exporter.clear()
    return _gate.exporter
