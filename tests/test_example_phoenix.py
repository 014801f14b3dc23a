"""``examples/phoenix.py`` sends a run Phoenix reads well: the exporter it builds receives
every span of the run, with the OpenInference keys, one session, and the usage spans.

The OTLP exporter package is not installed in the test environment (and no test reaches a
network): a fake module in its place hands the spans to an in-memory exporter.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import ClassVar

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "phoenix.py"
EXPORTER_MODULE = "opentelemetry.exporter.otlp.proto.http.trace_exporter"


class FakeOTLPSpanExporter(InMemorySpanExporter):
    """Shaped like the OTLP/HTTP exporter's constructor; keeps what it is sent."""

    made: ClassVar[list[FakeOTLPSpanExporter]] = []

    def __init__(self, *, endpoint: str) -> None:
        super().__init__()
        self.endpoint = endpoint
        self.made.append(self)

    def shutdown(self) -> None:  # keep the spans for the test to read
        pass


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.delenv("PHOENIX_COLLECTOR_ENDPOINT", raising=False)
    return load(monkeypatch)


def load(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The example as a module, its OTLP exporter the fake one."""
    FakeOTLPSpanExporter.made.clear()
    parts = EXPORTER_MODULE.split(".")
    for depth in range(2, len(parts)):
        name = ".".join(parts[:depth])
        if name not in sys.modules:
            monkeypatch.setitem(sys.modules, name, ModuleType(name))
    fake = ModuleType(EXPORTER_MODULE)
    fake.OTLPSpanExporter = FakeOTLPSpanExporter  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, EXPORTER_MODULE, fake)
    spec = importlib.util.spec_from_file_location("example_phoenix", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.anyio
async def test_the_phoenix_example_sends_every_span(
    example: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    await example.main()
    assert capsys.readouterr().out.startswith("completed: completed: confirmed: water")
    (exporter,) = FakeOTLPSpanExporter.made
    assert exporter.endpoint == "http://localhost:6006/v1/traces"
    spans = {span.name: span for span in exporter.get_finished_spans()}
    names = sorted(span.name for span in exporter.get_finished_spans())
    assert names == [
        "agent turn",
        "invoke_agent fact_checker",
        "invoke_agent fact_checker",
        "invoke_agent researcher",
        "usage fact_checker",
        "usage researcher",
    ]
    sessions = {
        dict(span.attributes or {}).get("session.id") for span in exporter.get_finished_spans()
    }
    assert len(sessions - {None}) == 1  # one run, one session
    researcher = dict(spans["invoke_agent researcher"].attributes or {})
    assert researcher["openinference.span.kind"] == "AGENT"
    assert researcher["input.value"] == "check two claims"
    assert json.loads(str(researcher["metadata"]))["agent_path"] == "/root/researcher"
    usage = dict(spans["usage researcher"].attributes or {})
    assert (usage["llm.token_count.total"], usage["llm.provider"]) == (1380, "openai")


def test_a_collector_address_with_a_trailing_slash_gets_one_slash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PHOENIX_COLLECTOR_ENDPOINT", "http://phoenix:6006/")
    assert load(monkeypatch).ENDPOINT == "http://phoenix:6006/v1/traces"
