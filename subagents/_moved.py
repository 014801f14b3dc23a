"""Names that left the top level of ``subagents``, and what an old import gets.

Every one keeps working: reading it warns with a ``DeprecationWarning`` that names what to
use instead, and returns the same object, so existing code runs while it migrates (a test
suite that turns warnings into errors sees the new name at once). A warning rather than
an ``AttributeError``: ``from subagents import name`` replaces a module ``__getattr__``'s
``AttributeError`` by a bare "cannot import name", which would hide the new name.
"""

from __future__ import annotations

import warnings
from typing import Final

from . import tools
from . import typing as public_typing
from .tools import _build

__all__ = ["moved_attribute"]

_LIMITS: Final = (
    "is private now; read the limits a toolset enforces from build_tools(...).limits "
    "(ToolLimits.wait_ceiling, ToolLimits.delegate_ceiling)"
)
MOVED: Final = {
    "ToolLimits": ("moved to subagents.tools.ToolLimits; import it from there", tools),
    "Backend": ("moved to subagents.typing.Backend; import it from there", public_typing),
    "Runner": ("moved to subagents.typing.Runner; import it from there", public_typing),
    "WAIT_MARGIN_RATIO": (_LIMITS, _build),
    "WAIT_MARGIN_MIN": (_LIMITS, _build),
    "NO_HOST_TIMEOUT_WAIT_CAP": (_LIMITS, _build),
    "wait_margin": (_LIMITS, _build),
}
"""Old top-level name: what to do instead, and the module that still holds it."""


def moved_attribute(name: str) -> object:
    """The module ``__getattr__`` of ``subagents``: a name that left the top level, with a
    ``DeprecationWarning``; any other unknown name is an ``AttributeError``."""
    if name not in MOVED:
        raise AttributeError(f"module 'subagents' has no attribute {name!r}")
    advice, module = MOVED[name]
    warnings.warn(f"subagents.{name} {advice}", DeprecationWarning, stacklevel=2)
    return getattr(module, name)
