"""The metric instruments of a manager, and the points each child records on them.

Pure: the instruments are a table (:data:`INSTRUMENTS`) and a child's measurements are
lists of :data:`Point`; :mod:`._tracing` creates the instruments from the table and
records the points (it is the only module that imports opentelemetry). The names are the
GenAI metric conventions' (``gen_ai.client.operation.duration``,
``gen_ai.client.token.usage``) and the library's own under ``subagents.``; see
``design/observability.md``.
"""

from __future__ import annotations

from typing import Final, Literal, TypeAlias

import attrs

from ._envelope import DelegateResult, Status
from ._semconv import Attributes, error_type, provider_name

__all__ = [
    "ACTIVE",
    "DURATION",
    "INSTRUMENTS",
    "QUEUE_WAIT",
    "TOKENS",
    "WATCHDOG",
    "Instrument",
    "Point",
    "end_points",
    "operation_attributes",
    "start_points",
]


@attrs.frozen(kw_only=True)
class Instrument:
    """One metric instrument, as the meter is asked to create it."""

    name: str
    """The metric name."""
    kind: Literal["histogram", "counter", "up_down_counter"]
    """Which of the meter's ``create_*`` methods makes it."""
    unit: str
    """The UCUM unit."""
    description: str
    """What it measures."""
    buckets: tuple[float, ...] | None = None
    """A histogram's advised bucket boundaries (``explicit_bucket_boundaries_advisory``)."""


# The bucket boundaries the GenAI metric conventions advise for their two histograms.
_DURATION_BUCKETS: Final = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
_TOKEN_BUCKETS: Final = tuple(float(4**i) for i in range(14))

DURATION: Final = Instrument(
    name="gen_ai.client.operation.duration",
    kind="histogram",
    unit="s",
    description="GenAI operation duration: the run time of a subagent "
    "(gen_ai.operation.name=invoke_agent, from its start, queue excluded).",
    buckets=_DURATION_BUCKETS,
)
TOKENS: Final = Instrument(
    name="gen_ai.client.token.usage",
    kind="histogram",
    unit="{token}",
    description="Number of input and output tokens a subagent reported.",
    buckets=_TOKEN_BUCKETS,
)
ACTIVE: Final = Instrument(
    name="subagents.active",
    kind="up_down_counter",
    unit="{agent}",
    description="Subagents running now.",
)
QUEUE_WAIT: Final = Instrument(
    name="subagents.queue.wait",
    kind="histogram",
    unit="s",
    description="Time a spawned subagent waited for a concurrency slot.",
)
WATCHDOG: Final = Instrument(
    name="subagents.watchdog.fired",
    kind="counter",
    unit="{agent}",
    description="Subagents stopped by their watchdog.",
)
INSTRUMENTS: Final = (DURATION, TOKENS, ACTIVE, QUEUE_WAIT, WATCHDOG)
"""Every instrument a manager creates, all or none (when no meter records anything)."""

Point: TypeAlias = tuple[str, float, Attributes]
"""One measurement: the instrument's name, the value (a counter's increment) and the
point's attributes."""


def operation_attributes(agent: str, provider: str | None, model: str | None) -> Attributes:
    """The attributes of a child's ``gen_ai.client.*`` points (before ``error.type`` and
    ``gen_ai.token.type``)."""
    attributes: Attributes = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.provider.name": provider_name(provider),
        "gen_ai.agent.name": agent,
    }
    if model:
        attributes["gen_ai.request.model"] = model
    return attributes


def start_points(agent: str, queue_s: float | None) -> list[Point]:
    """What a child records when its runner starts: one more active subagent, and for a
    spawn (``queue_s`` given; an execute takes no slot) its wait for a slot."""
    attributes: Attributes = {"gen_ai.agent.name": agent}
    points: list[Point] = [(ACTIVE.name, 1, attributes)]
    if queue_s is not None:
        points.append((QUEUE_WAIT.name, max(queue_s, 0.0), attributes))
    return points


def end_points(
    envelope: DelegateResult, operation: Attributes, *, elapsed: float, counted: bool
) -> list[Point]:
    """What a child records when its envelope exists.

    Args:
        envelope: the child's one envelope.
        operation: its :func:`operation_attributes`.
        elapsed: its run time in seconds (from its start; queue excluded).
        counted: whether its start counted it as active (a child cancelled in the queue
            never started).
    """
    agent: Attributes = {"gen_ai.agent.name": envelope.agent}
    points: list[Point] = []
    if counted:
        points.append((ACTIVE.name, -1, agent))
    usage = envelope.usage
    if usage.input_tokens or usage.output_tokens:
        for token_type, count in (("input", usage.input_tokens), ("output", usage.output_tokens)):
            points.append((TOKENS.name, count, {**operation, "gen_ai.token.type": token_type}))
    failure = error_type(envelope)
    duration = operation if failure is None else {**operation, "error.type": failure}
    points.append((DURATION.name, elapsed, duration))
    if envelope.status is Status.TIMEOUT:
        points.append((WATCHDOG.name, 1, agent))
    return points
