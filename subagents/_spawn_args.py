"""The rules for a spawn's arguments: options given once, the timeout that applies, the
depth limit, and task ids."""

from __future__ import annotations

from typing import Final

from ._errors import ConfigError, SpawnRejected
from ._paths import AgentPath
from ._spec import UNSET, AgentSpec, SpawnOptions, _Unset
from ._validators import seconds

__all__ = ["NO_OPTIONS", "depth_error", "spawn_options", "spawn_timeout"]

NO_OPTIONS: Final = SpawnOptions()


def spawn_options(
    options: SpawnOptions | None, timeout: float | _Unset | None, name: str | None
) -> SpawnOptions:
    """``options`` checked: a :class:`SpawnOptions` (or none), and no setting given both
    as an argument and in it (neither may silently win over the other)."""
    if options is None:
        return NO_OPTIONS
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


def depth_error(parent_path: AgentPath, max_depth: int) -> SpawnRejected:
    """The error for a child of ``parent_path`` that would be deeper than ``max_depth``
    (``/root`` is at depth 0)."""
    return SpawnRejected(
        "depth",
        f"delegation depth limit reached: {parent_path} is at depth "
        f"{parent_path.depth} and max_depth is {max_depth}, so it cannot have children",
    )
