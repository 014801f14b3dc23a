"""How each runner travels to the Ray workers, remembered on the driver while it lives.

Nothing here imports ray: :class:`Targets` is given the pickler for runners shipped by
value (Ray's cloudpickle). A module-level function travels as its import path; another
function (a closure, one of ``__main__``, or a copy claiming ``__main__`` when the workers
cannot import its module) is pickled by value once, and the same bytes travel with every
call, which the worker unpickles once (as Ray does with a remote function's code, what
the function closes over is taken when it is first shipped); any other callable travels
as itself, pickled with each call, so each call sees its current state.
"""

from __future__ import annotations

import types
import weakref
from collections.abc import Callable
from typing import TypeAlias

from ._ray_wire import Runner, Target, by_value, target_of

__all__ = ["Targets"]

_How: TypeAlias = "str | bytes | None"
"""An entry: the import path, the function pickled by value, or None (the callable
travels as itself)."""


class Targets:
    """How each runner travels. Keyed by ``id()``, as a runner may be unhashable or
    compare by value, with a weak reference whose end drops the entry: nothing here keeps
    a runner, nor what it closes over, alive (a pickled function is bytes, not the
    objects it closes over). A runner that takes no weak reference is looked at (and
    pickled) again on each call."""

    def __init__(self, dumps: Callable[[object], bytes]) -> None:
        self._dumps = dumps
        self._known: dict[int, tuple[weakref.ref[Runner], _How]] = {}

    def target(self, runner: Runner) -> Target:
        """How ``runner`` travels: its import path, its pickled code, or itself."""
        entry = self._known.get(id(runner))
        if entry is not None and entry[0]() is runner:
            how = entry[1]
        else:
            found = target_of(runner)
            how = found if isinstance(found, str) else self._pickled(runner)
            self._remember(runner, how)
        return runner if how is None else how

    def copy(self, runner: Runner) -> Target:
        """``runner`` by value, from now on (the workers cannot import its path)."""
        copy = by_value(runner)
        how = self._pickled(copy)
        self._remember(runner, how)
        return copy if how is None else how

    def _pickled(self, runner: Runner) -> bytes | None:
        if not isinstance(runner, types.FunctionType):
            return None
        return self._dumps(runner)

    def _remember(self, runner: Runner, how: _How) -> None:
        key = id(runner)
        known = self._known
        try:
            ref = weakref.ref(runner, lambda _: known.pop(key, None))
        except TypeError:  # no weak reference to it: nothing to remember it by
            return
        known[key] = (ref, how)
