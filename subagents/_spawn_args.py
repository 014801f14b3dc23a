"""The rules for a spawn's arguments: options given once, the timeout that applies, the
depth limit, and task ids."""

from __future__ import annotations

import os
from typing import Final

from ._errors import ConfigError, SpawnRejected
from ._paths import AgentPath
from ._spec import UNSET, AgentSpec, SpawnOptions, _Unset
from ._validators import seconds

__all__ = ["check_depth", "new_task_id", "spawn_options", "spawn_timeout"]

_NO_OPTIONS: Final = SpawnOptions()


def spawn_options(
    options: SpawnOptions | None, timeout: float | _Unset | None, name: str | None
) -> SpawnOptions:
    """``options`` checked: a :class:`SpawnOptions` (or none), and no setting given both
    as an argument and in it (neither may silently win over the other)."""
    if options is None:
        return _NO_OPTIONS
    if not isinstance(options, SpawnOptions):
        raise ConfigError("options", "a SpawnOptions or None", options)
    if timeout is not UNSET and options.timeout is not None:
        raise ConfigError(
            "timeout",
            f"given once: as timeout= or as options.timeout (here {options.timeout!r}), not both",
            timeout,
        )
    if name is not None and options.name is not None:
        raise ConfigError(
            "name",
            f"given once: as name= or as options.name (here {options.name!r}), not both",
            name,
        )
    return options


def spawn_timeout(
    timeout: float | _Unset | None, options: SpawnOptions, spec: AgentSpec, default: float | None
) -> float | None:
    """The watchdog seconds that apply: the argument, else the option, else the agent's,
    else ``default``; ``None`` disables the watchdog."""
    if timeout is UNSET:
        if options.timeout is not None:
            return options.timeout
        return spec.timeout if spec.timeout is not None else default
    return None if timeout is None else seconds("timeout", timeout, none_ok=False, zero_ok=False)


def check_depth(parent_path: AgentPath, is_child: bool, max_depth: int) -> None:
    """Raise :class:`SpawnRejected` if a child of ``parent_path`` would be too deep."""
    depth = parent_path.depth + 1 if is_child else 1  # /root is at depth 0
    if depth > max_depth:
        raise SpawnRejected(
            "depth",
            f"delegation depth limit reached: {parent_path} is at depth "
            f"{parent_path.depth} and max_depth is {max_depth}, so it cannot have children",
        )


def new_task_id() -> str:
    """12 random hex digits: 48 bits from the OS."""
    return os.urandom(6).hex()
