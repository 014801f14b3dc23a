"""Guards the public surface: the exact names of each public module, the module every
public object names, the exception tree, and what a name that left the top level does."""

from __future__ import annotations

import inspect
import types

import pytest

import subagents
import subagents.backends.command
import subagents.mcp
import subagents.room
import subagents.testing
import subagents.tools
import subagents.typing
from subagents import _errors

TOP_LEVEL = {
    # the manager
    "DEFAULT_SESSION", "Completions", "ManagerStatistics", "SpawnHandle", "SpawnOptions",
    "SubagentConfig", "SubagentManager",
    # agents and their runs
    "AgentPath", "AgentSpec", "Budget", "Request", "Result", "RetryPolicy", "RunContext", "Ruleset",
    "run_local",
    # results and their delivery
    "BaseMailbox", "CompletionNotifier", "DelegateResult", "Mailbox", "MailboxStatistics",
    "Status", "Usage",
    # messages between agents
    "DEFAULT_INBOX_CAPACITY", "MAX_MESSAGE_CHARS", "Activity", "Message", "PeerInfo",
    "Receipt", "Reply",
    # lifecycle events
    "Event", "EventBus", "EventStream", "JsonlSink", "read_events",
    # errors
    "ConfigError", "InvalidName", "MailboxFull", "RunnerReturnError", "SpawnRejected",
    "SubagentsError", "TransientError", "UnknownAgent", "UnknownPeer",
    "UnknownTask",
}  # fmt: skip
TOOLS = {"Tool", "ToolLimits", "ToolResult", "Toolset", "build_tools"}
TYPING = {"Backend", "JSONValue", "Responder", "Runner"}
MCP = {"build_server", "serve"}
COMMAND = {"CommandFailed", "CommandRunner", "MissingField", "command_agent", "fill_template"}
ROOM = {
    "AUTONOMY", "DEFAULT_LEASE_TTL", "DELIVERY_STATES", "HARNESS_KEY", "MEMBER_ID", "Autonomy",
    "Claim", "DeliveryState", "Drift", "Inbox", "Joined", "Lease", "LeaseCheck", "LeaseNotHeld",
    "Liveness", "Member", "Message", "Received", "Room", "RoomLink", "Sent", "SentMessage",
    "Severity", "UnknownMember", "bridge", "room_tools",
}  # fmt: skip
COMPAT = {"Tool", "ToolResult", "Toolset", "build_tools"}
"""Still importable from the top level, without a warning, though not in its __all__."""
MOVED = {"ToolLimits": subagents.tools, "Runner": subagents.typing, "Backend": subagents.typing}
PRIVATE = {"WAIT_MARGIN_RATIO", "WAIT_MARGIN_MIN", "NO_HOST_TIMEOUT_WAIT_CAP", "wait_margin"}
PUBLIC_MODULES = (
    subagents,
    subagents.tools,
    subagents.typing,
    subagents.testing,
    subagents.mcp,
    subagents.backends.command,
    subagents.room,
)


@pytest.mark.parametrize(
    ("module", "names"),
    [
        (subagents, TOP_LEVEL),
        (subagents.tools, TOOLS),
        (subagents.typing, TYPING),
        (subagents.mcp, MCP),
        (subagents.backends.command, COMMAND),
        (subagents.room, ROOM),
    ],
    ids=[
        "subagents",
        "subagents.tools",
        "subagents.typing",
        "subagents.mcp",
        "command",
        "subagents.room",
    ],
)
def test_all_is_exactly_the_public_surface(module: types.ModuleType, names: set[str]) -> None:
    assert len(module.__all__) == len(set(module.__all__)), "a name is listed twice"
    assert set(module.__all__) == names
    for name in module.__all__:
        assert hasattr(module, name), name


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from subagents import *", namespace)
    assert set(namespace) - {"__builtins__"} == TOP_LEVEL


def _public_objects() -> list[object]:
    found: list[object] = []
    for module in PUBLIC_MODULES:
        for name in module.__all__:
            obj = getattr(module, name)
            # Type aliases are forward-reference strings and constants have no module.
            if inspect.isclass(obj) or inspect.isfunction(obj):
                found.append(
                    pytest.param(module.__name__, name, obj, id=f"{module.__name__}.{name}")
                )
    return found


@pytest.mark.parametrize(("module", "name", "obj"), _public_objects())
def test_every_public_object_names_its_public_module(module: str, name: str, obj: object) -> None:
    assert obj.__module__ == module  # type: ignore[attr-defined]
    assert obj.__qualname__ == name  # type: ignore[attr-defined]


def test_the_tools_are_one_object_under_both_names() -> None:
    for name in COMPAT:
        assert getattr(subagents, name) is getattr(subagents.tools, name)
        assert getattr(subagents, name).__module__ == "subagents.tools"


def test_compatibility_names_import_without_a_warning() -> None:
    # filterwarnings = error: any warning here fails the test.
    namespace: dict[str, object] = {}
    exec("from subagents import Tool, ToolResult, Toolset, build_tools", namespace)
    assert namespace["build_tools"] is subagents.tools.build_tools


@pytest.mark.parametrize("name", sorted(MOVED))
def test_a_moved_name_warns_with_its_new_home_and_still_works(name: str) -> None:
    new_home = MOVED[name]
    advice = rf"subagents\.{name} moved to {new_home.__name__}\.{name}"
    with pytest.deprecated_call(match=advice) as record:
        obj = getattr(subagents, name)
    assert obj is getattr(new_home, name)
    assert record[0].filename == __file__, "the warning points at the line using the name"
    namespace: dict[str, object] = {}
    with pytest.deprecated_call(match=advice):
        exec(f"from subagents import {name}", namespace)
    assert namespace[name] is obj


@pytest.mark.parametrize("name", sorted(PRIVATE))
def test_a_name_made_private_warns_with_its_replacement_and_still_works(name: str) -> None:
    advice = rf"subagents\.{name} is private now; read .* build_tools\(\.\.\.\)\.limits"
    with pytest.deprecated_call(match=advice):
        obj = getattr(subagents, name)
    # private: the private module is the one place these names live now, no public way to
    # read them.
    assert obj is getattr(subagents.tools._build, name)
    # The warning, unlike an AttributeError, survives the from-import form.
    with pytest.deprecated_call(match=advice):
        exec(f"from subagents import {name}", {})


def test_the_old_margin_rule_still_holds_through_the_shim() -> None:
    with pytest.deprecated_call():
        wait_margin = subagents.wait_margin  # type: ignore[attr-defined]
    assert wait_margin(60.0) == pytest.approx(6.0)
    assert wait_margin(0.1) == pytest.approx(0.02)


def test_an_unknown_name_is_a_plain_attribute_error() -> None:
    with pytest.raises(AttributeError, match="module 'subagents' has no attribute 'nope'"):
        subagents.nope  # type: ignore[attr-defined]  # noqa: B018
    assert not hasattr(subagents, "nope")


def _exceptions() -> list[type[BaseException]]:
    return [
        obj
        for name in subagents.__all__
        if isinstance(obj := getattr(subagents, name), type) and issubclass(obj, BaseException)
    ]


def test_every_library_error_is_under_subagents_error() -> None:
    errors = _exceptions()
    assert {e.__name__ for e in errors} == {
        "ConfigError", "InvalidName", "MailboxFull", "RunnerReturnError", "SpawnRejected",
        "SubagentsError", "TransientError", "UnknownAgent", "UnknownPeer", "UnknownTask",
    }  # fmt: skip
    assert issubclass(subagents.SubagentsError, Exception)
    for error in errors:
        # TransientError is raised by runners, never by the library (see _errors).
        assert issubclass(error, subagents.SubagentsError) != (error is subagents.TransientError)
    assert issubclass(subagents.UnknownAgent, LookupError)
    assert issubclass(subagents.UnknownTask, LookupError)
    assert issubclass(subagents.UnknownPeer, LookupError)
    assert issubclass(subagents.ConfigError, ValueError)
    assert issubclass(subagents.InvalidName, ValueError)
    assert issubclass(subagents.RunnerReturnError, TypeError)


def test_the_tree_drawn_in_the_errors_docstring_is_complete() -> None:
    doc = _errors.__doc__ or ""
    for error in _exceptions():
        bases = ", ".join(b.__name__ for b in error.__bases__)
        drawn = (
            error.__name__ if error is subagents.SubagentsError else f"{error.__name__}({bases})"
        )
        assert drawn in doc, drawn


def test_runner_return_error_keeps_its_data() -> None:
    error = subagents.RunnerReturnError("writer", "int; expected Result or str")
    assert (error.agent, error.detail) == ("writer", "int; expected Result or str")
    assert str(error) == "runner of agent 'writer' returned int; expected Result or str"
