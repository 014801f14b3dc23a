"""The names the library writes to OpenTelemetry, and the attribute dicts of its spans.

Pure: names, bounds and dicts of plain values; :mod:`._tracing` hands them to
OpenTelemetry (it is the only module that imports it). The conventions are the
OpenTelemetry GenAI agent spans (``invoke_agent {agent}``, ``execute_tool {tool}``,
``gen_ai.agent.*``, ``gen_ai.usage.*``); what they do not define is named under
``subagents.``, and the deprecated ``gen_ai.system`` is never written. The metric names
are in :mod:`._metrics`. See ``design/observability.md``.

Beside the GenAI names, every span carries the OpenInference keys that LLM tracing UIs
(Arize Phoenix and others) read: ``openinference.span.kind``, ``input.value`` /
``output.value`` with their mime types (content, so only under ``capture_content``),
``tool.*`` and a ``metadata`` JSON without content. They are written here and nowhere
else, as plain strings: the library does not depend on the OpenInference package (the
tests check the strings against its constants).

Every text that can grow with what a runner or a model sends (names, ids, prompts,
outputs, tool arguments and results) is bounded here, so no span grows with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final, TypeAlias

from ._envelope import DelegateResult, Status, bound_text, clean_text
from ._json import JSONValue, dumps_str, loads

if TYPE_CHECKING:
    from ._record import ChildRecord

__all__ = [
    "BAGGAGE_AGENT_PATH",
    "BAGGAGE_CONVERSATION_ID",
    "BAGGAGE_TASK_ID",
    "DEFAULT_PROVIDER",
    "DEFAULT_USAGE_MODEL",
    "EVENT_EXCEPTION",
    "EVENT_QUEUED",
    "EVENT_STARTED",
    "EVENT_WATCHDOG",
    "INSTRUMENTATION",
    "MESSAGE_CONTENT_LIMIT",
    "NAME_LIMIT",
    "TOOL_CONTENT_LIMIT",
    "USAGE_SPAN_PREFIX",
    "AttributeValue",
    "Attributes",
    "bounded_content",
    "bounded_name",
    "child_attributes",
    "child_model",
    "conversation_of",
    "end_attributes",
    "error_type",
    "exception_attributes",
    "input_attributes",
    "invoke_agent_attributes",
    "provider_name",
    "qualified_name",
    "tool_attributes",
    "tool_result_attributes",
    "usage_attributes",
]

AttributeValue: TypeAlias = str | bool | int | float
Attributes: TypeAlias = dict[str, AttributeValue]

INSTRUMENTATION: Final = "subagents"
"""The instrumentation scope name of the tracer and the meter."""

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
MESSAGE_CONTENT_LIMIT: Final = 4096
"""Bound (characters) of each captured message attribute (``gen_ai.input.messages``,
``gen_ai.system_instructions``, ``gen_ai.output.messages``): the text inside is cut, ending
in an ellipsis, so the attribute stays valid JSON."""
NAME_LIMIT: Final = 128
"""Bound (characters) of a tool, agent or call id name in a span name or attribute."""

USAGE_SPAN_PREFIX: Final = "usage"
"""The name of a usage span is ``usage {agent}`` (``SubagentConfig.usage_spans``)."""
DEFAULT_USAGE_MODEL: Final = "unknown"
"""``llm.model_name`` of a usage span when neither the spawn nor the spec names a model."""

# OpenInference: the keys LLM tracing UIs read (Phoenix shows input.value / output.value,
# counts llm.token_count.* on LLM spans, and groups spans into sessions by session.id).
_OI_KIND: Final = "openinference.span.kind"
_OI_SESSION: Final = "session.id"
_OI_INPUT: Final = "input.value"
_OI_INPUT_MIME: Final = "input.mime_type"
_OI_OUTPUT: Final = "output.value"
_OI_OUTPUT_MIME: Final = "output.mime_type"
_OI_METADATA: Final = "metadata"
_TEXT: Final = "text/plain"
_JSON: Final = "application/json"

# The events of an invoke_agent span: a spawn was queued, its runner started, its
# watchdog fired, it ended in an exception.
EVENT_QUEUED: Final = "queued"
EVENT_STARTED: Final = "started"
EVENT_WATCHDOG: Final = "watchdog.fired"
EVENT_EXCEPTION: Final = "exception"


def provider_name(provider: str | None) -> str:
    """``gen_ai.provider.name``: ``AgentSpec.provider``, else :data:`DEFAULT_PROVIDER`."""
    return provider or DEFAULT_PROVIDER


def error_type(envelope: DelegateResult) -> str | None:
    """``error.type`` of a child that did not complete (``None`` if it did)."""
    if envelope.status is Status.COMPLETED:
        return None
    return envelope.error_type or envelope.status.value


# ------------------------------------------------------------------ invoke_agent


def invoke_agent_attributes(
    *,
    agent: str,
    description: str,
    provider: str | None,
    model: str | None,
    task_id: str,
    agent_path: str,
    parent_path: str,
    session_id: str,
    conversation_id: str,
    sync: bool,
) -> Attributes:
    """The attributes an ``invoke_agent {agent}`` span starts with."""
    attributes: Attributes = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": agent,
        "gen_ai.agent.id": task_id,
        "gen_ai.agent.description": description,
        "gen_ai.conversation.id": conversation_id,
        "subagents.task_id": task_id,
        "subagents.agent_path": agent_path,
        "subagents.parent_path": parent_path,
        "subagents.session_id": session_id,
        "subagents.mode": "execute" if sync else "spawn",
        "gen_ai.provider.name": provider_name(provider),
        _OI_KIND: "AGENT",
        _OI_SESSION: conversation_id,
    }
    if model:
        attributes["gen_ai.request.model"] = model
    return attributes


DEFAULT_SESSION: Final = "root"
"""The manager's default session (``_manager.DEFAULT_SESSION``): its trees belong to the run."""


def conversation_of(root_session: str, run_conversation_id: str) -> str:
    """``gen_ai.conversation.id`` of a tree spawned into ``root_session``: a session the
    caller named is its own conversation; the default session's trees are the run's
    (``SubagentConfig.conversation_id``, else an id unique to the manager's run)."""
    return run_conversation_id if root_session == DEFAULT_SESSION else root_session


def child_model(record: ChildRecord) -> str | None:
    """The model a child runs with: its spawn's, else its agent's (``None``: unknown)."""
    model = record.request.model
    return model if model is not None else record.spec.model


def child_attributes(
    record: ChildRecord, conversation_id: str, *, capture_content: bool
) -> Attributes:
    """The attributes the ``invoke_agent`` span of ``record`` starts with."""
    spec, request = record.spec, record.request
    attributes = invoke_agent_attributes(
        agent=spec.name,
        description=spec.description,
        provider=spec.provider,
        model=child_model(record),
        task_id=record.task_id,
        agent_path=str(record.agent_path),
        parent_path=str(record.parent_path),
        session_id=record.session_id,
        conversation_id=conversation_id,
        sync=record.sync,
    )
    if capture_content:
        attributes.update(input_attributes(request.prompt, request.input))
    return attributes


def input_attributes(prompt: str | None, text: str) -> Attributes:
    """The request as GenAI message JSON and as OpenInference's ``input.value`` (only
    under ``capture_content``), bounded."""
    attributes: Attributes = {}
    if prompt:
        attributes["gen_ai.system_instructions"] = _messages(_instructions, prompt)
    attributes["gen_ai.input.messages"] = _messages(_user_message, text)
    attributes[_OI_INPUT] = _bounded_message(text)
    attributes[_OI_INPUT_MIME] = _TEXT
    return attributes


def end_attributes(envelope: DelegateResult, *, capture_content: bool) -> Attributes:
    """The attributes set on an ``invoke_agent`` span when its envelope exists."""
    usage, tree = envelope.usage, envelope.tree_usage
    attributes: Attributes = {
        "gen_ai.usage.input_tokens": usage.input_tokens,
        "gen_ai.usage.output_tokens": usage.output_tokens,
        # Not in the GenAI conventions: the usage of the agent and its whole subtree.
        "subagents.tree_usage.input_tokens": tree.input_tokens,
        "subagents.tree_usage.output_tokens": tree.output_tokens,
        "subagents.status": envelope.status.value,
        "subagents.iterations": envelope.iterations,
        "subagents.queue_ms": envelope.queue_ms,
    }
    if envelope.attempts != 1:
        attributes["subagents.attempts"] = envelope.attempts
    failure = error_type(envelope)
    if failure is not None:
        attributes["error.type"] = failure
    attributes[_OI_METADATA] = dumps_str(_metadata(envelope))
    if capture_content:
        completed = envelope.status is Status.COMPLETED
        if envelope.output:
            # finish_reason is Required on each output message; a UI drops an output
            # whose entries lack it.
            reason = "stop" if completed else "error"
            attributes["gen_ai.output.messages"] = _messages(
                lambda text: _assistant_message(text, reason), envelope.output
            )
        answer = envelope.output if completed else envelope.error
        if answer:
            attributes[_OI_OUTPUT] = _bounded_message(answer)
            attributes[_OI_OUTPUT_MIME] = _TEXT
    return attributes


def _metadata(envelope: DelegateResult) -> dict[str, JSONValue]:
    """OpenInference's ``metadata`` of an ``invoke_agent`` span: what tells repeated agents
    apart in a UI that shows it (their paths, the queue wait), and no content."""
    return {
        "agent_path": envelope.agent_path,
        "parent_path": envelope.parent_path,
        "task_id": envelope.task_id,
        "status": envelope.status.value,
        "queue_ms": envelope.queue_ms,
        "attempts": envelope.attempts,
        "iterations": envelope.iterations,
    }


def usage_attributes(
    envelope: DelegateResult, *, provider: str | None, model: str | None, conversation_id: str
) -> Attributes:
    """The attributes of a child's usage span (``SubagentConfig.usage_spans``): its own
    tokens in the form LLM tracing UIs count (an OpenInference ``LLM`` span), with the
    model and provider that price them. The GenAI ``gen_ai.usage.*`` stay on the
    ``invoke_agent`` span alone, so a GenAI backend never counts them twice."""
    usage = envelope.usage
    attributes: Attributes = {
        _OI_KIND: "LLM",
        "llm.token_count.prompt": usage.input_tokens,
        "llm.token_count.completion": usage.output_tokens,
        "llm.token_count.total": usage.input_tokens + usage.output_tokens,
        "llm.model_name": model or DEFAULT_USAGE_MODEL,
        _OI_SESSION: conversation_id,
        "gen_ai.conversation.id": conversation_id,
        "subagents.task_id": envelope.task_id,
        "subagents.agent_path": envelope.agent_path,
    }
    if provider:
        # OpenInference's providers are a closed list (OpenInferenceLLMProviderValues): the
        # GenAI default stand-in is no provider to a UI that prices by it, so none is named.
        attributes["llm.provider"] = provider
    return attributes


def exception_attributes(envelope: DelegateResult) -> Attributes:
    """The ``exception`` span event of a child that ended in an error."""
    return {
        "exception.type": error_type(envelope) or "",
        "exception.message": envelope.error,
    }


def _instructions(text: str) -> JSONValue:
    return [{"type": "text", "content": text}]


def _user_message(text: str) -> JSONValue:
    return [{"role": "user", "parts": [{"type": "text", "content": text}]}]


def _assistant_message(text: str, finish_reason: str) -> JSONValue:
    return [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": text}],
            "finish_reason": finish_reason,
        }
    ]


def _bounded_message(text: str) -> str:
    """A text value (``input.value``, ``output.value``) cut to
    :data:`MESSAGE_CONTENT_LIMIT` characters and made encodable."""
    return clean_text(bound_text(text, MESSAGE_CONTENT_LIMIT))


def _messages(wrap: Callable[[str], JSONValue], text: str) -> str:
    """``wrap(text)`` as JSON of at most :data:`MESSAGE_CONTENT_LIMIT` characters: when it
    is longer, the longest start of ``text`` (ending in an ellipsis) whose JSON fits, so
    the JSON around it stays whole and valid. A lone surrogate (a request's text is not
    checked) is replaced, as JSON cannot carry it."""
    text = clean_text(bound_text(text, MESSAGE_CONTENT_LIMIT))  # more never fits
    encoded = dumps_str(wrap(text))
    if len(encoded) <= MESSAGE_CONTENT_LIMIT:
        return encoded
    # Escapes make the JSON of a character 1 to 6 characters long, so search for the cut:
    # a longer cut never has shorter JSON, and the ellipsis alone always fits.
    low, high = 1, len(text)
    while low < high:
        middle = (low + high + 1) // 2
        if len(dumps_str(wrap(bound_text(text, middle)))) <= MESSAGE_CONTENT_LIMIT:
            low = middle
        else:
            high = middle - 1
    return dumps_str(wrap(bound_text(text, low)))


# ------------------------------------------------------------------ execute_tool


def tool_attributes(
    tool: str,
    *,
    call_id: str | None,
    description: str | None,
    arguments: str | None,
    transfer_target: str | None,
    conversation_id: str | None,
    parameters: str | None = None,
) -> Attributes:
    """The attributes an ``execute_tool {tool}`` span starts with (``tool`` bounded by the
    caller, as it also names the span).

    Names and ids may come from a model (an unknown tool, a made-up agent): they are
    bounded, so a span's attributes never grow with what a model sends.
    """
    attributes: Attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool,
        "gen_ai.tool.type": "function",
        _OI_KIND: "TOOL",
        "tool.name": tool,
    }
    if call_id:
        attributes["gen_ai.tool.call.id"] = bounded_name(call_id)
    if description:
        attributes["gen_ai.tool.description"] = description
        attributes["tool.description"] = description
    if parameters is not None:
        attributes["tool.parameters"] = parameters
    if arguments is not None:
        text = bounded_content(arguments)
        attributes["gen_ai.tool.call.arguments"] = text
        attributes[_OI_INPUT] = text
        attributes[_OI_INPUT_MIME] = _JSON if _is_json(text) else _TEXT
    if transfer_target:
        # The GenAI conventions' transfer attributes (gen_ai.transfer.*) exist only in an
        # in-development refinement of execute_tool, so these stay in our namespace.
        attributes["subagents.transfer.mode"] = "return_to_caller"
        attributes["subagents.transfer.target.name"] = bounded_name(transfer_target)
        attributes["subagents.transfer.target.type"] = "agent"
    if conversation_id is not None:
        attributes["gen_ai.conversation.id"] = conversation_id
        attributes[_OI_SESSION] = conversation_id
    return attributes


def tool_result_attributes(text: str, *, failed: bool) -> Attributes:
    """What a tool call answered (only under ``capture_content``), bounded: the GenAI
    result of a successful call, and OpenInference's ``output.value`` of any call (for a
    failed one the error the model reads)."""
    text = bounded_content(text)
    attributes: Attributes = {_OI_OUTPUT: text, _OI_OUTPUT_MIME: _TEXT}
    if not failed:
        attributes["gen_ai.tool.call.result"] = text
    return attributes


def _is_json(text: str) -> bool:
    try:
        loads(text)
    except ValueError:
        return False
    return True


def bounded_name(name: str) -> str:
    """``name`` cut to :data:`NAME_LIMIT` characters (ending in an ellipsis when cut)."""
    return bound_text(name, NAME_LIMIT)


def bounded_content(text: str) -> str:
    """``text`` cut to :data:`TOOL_CONTENT_LIMIT` characters (ending in an ellipsis)."""
    return bound_text(text, TOOL_CONTENT_LIMIT)


def qualified_name(exc: BaseException) -> str:
    """``error.type`` of an exception: its class, qualified unless a builtin."""
    cls = type(exc)
    if cls.__module__ in ("builtins", "__main__"):
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"
