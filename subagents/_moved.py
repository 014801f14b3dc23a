"""Names that left the top level of ``subagents``, and what an old import gets.

A name that moved keeps working: reading it warns with a ``DeprecationWarning`` naming its
new home and returns the same object, so existing code runs while it migrates (a test
suite running with warnings as errors sees the new name at once). A name that became
private raises an ``AttributeError`` saying what replaces it.
"""

from __future__ import annotations

import warnings
from typing import Final

from . import tools
from . import typing as public_typing

__all__ = ["moved_attribute"]

MOVED: Final = {
    "ToolLimits": ("subagents.tools", tools),
    "Backend": ("subagents.typing", public_typing),
    "Runner": ("subagents.typing", public_typing),
}
"""Old top-level name: the public module it lives in now, and that module."""

_WAIT_LIMITS: Final = (
    "read the limits a toolset enforces from build_tools(...).limits "
    "(ToolLimits.wait_ceiling, ToolLimits.delegate_ceiling)"
)
PRIVATE: Final = {
    "WAIT_MARGIN_RATIO": _WAIT_LIMITS,
    "WAIT_MARGIN_MIN": _WAIT_LIMITS,
    "NO_HOST_TIMEOUT_WAIT_CAP": _WAIT_LIMITS,
    "wait_margin": _WAIT_LIMITS,
}
"""Old top-level name that became private: what to use instead."""


def moved_attribute(name: str) -> object:
    """The module ``__getattr__`` of ``subagents``: a moved name with a warning, else an
    ``AttributeError`` (naming the replacement of a name that became private)."""
    if name in MOVED:
        where, module = MOVED[name]
        warnings.warn(
            f"subagents.{name} moved to {where}.{name}; import it from {where}",
            DeprecationWarning,
            stacklevel=3,
        )
        return getattr(module, name)
    if name in PRIVATE:
        raise AttributeError(f"subagents.{name} is private now; {PRIVATE[name]}")
    raise AttributeError(f"module 'subagents' has no attribute {name!r}")
