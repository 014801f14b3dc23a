"""Guards the public surface: every name in __all__ exists and nothing private leaks."""

from __future__ import annotations

import subagents


def test_all_names_exist() -> None:
    for name in subagents.__all__:
        assert hasattr(subagents, name), name


def test_core_names_are_public() -> None:
    required = {
        "Status", "Usage", "DelegateResult", "Request", "Result", "AgentSpec", "RunContext",
        "AgentPath", "Mailbox", "MailboxFull", "CompletionNotifier", "SubagentManager",
        "SubagentConfig", "SpawnHandle", "SpawnOptions", "Ruleset", "SubagentsError",
        "UnknownAgent", "UnknownTask", "SpawnRejected", "ConfigError",
    }  # fmt: skip
    assert required <= set(subagents.__all__)


def test_error_tree() -> None:
    for name in ("UnknownAgent", "UnknownTask", "SpawnRejected", "ConfigError", "MailboxFull"):
        assert issubclass(getattr(subagents, name), subagents.SubagentsError)
    assert issubclass(subagents.UnknownAgent, LookupError)
    assert issubclass(subagents.ConfigError, ValueError)
