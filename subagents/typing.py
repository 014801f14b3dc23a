"""Type aliases for annotating code that uses ``subagents``.

Each is a forward reference (a string at run time), meant for annotations only::

    from subagents.typing import Runner

    def make_runner() -> Runner: ...
"""

from ._backend import Backend
from ._json import JSONValue
from ._spec import Responder, Runner

__all__ = ["Backend", "JSONValue", "Responder", "Runner"]
