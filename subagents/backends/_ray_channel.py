"""The driver's calls to one actor of the pool, batched: a channel per actor and event loop.

A bare Ray call costs the driver about 0.3 ms: Ray binds and serializes its arguments,
submits it, and completes a future per call in its own thread, whose reply then has to
take the GIL from the event loop. A channel makes one Ray call (``submit``) for the
attempts that reach it together, and keeps one collect pending on the actor while any of
its calls runs, which answers with every call that ended since the one before (a submit
sent with no collect pending is that collect as well). So an attempt costs the driver a
pickle and a dictionary entry, and its completion a share of one Ray reply. A cancel is
one ``cancel`` call.

A channel belongs to one event loop (an anyio ``RunVar``): its completions wake that
loop's waiters, through :func:`~._ray_bridge.when_done`. It names itself to the actor by a
random name, under which the actor keeps what its calls left. When the actor dies (it was
killed, its process crashed, its node was lost), the pending ``collect`` fails, and so does
every call of the channel, with Ray's error. No Ray call goes out once Ray has shut down
(Ray would start a new local cluster for it): the calls end in ``ClusterLostError``.
Nothing here imports ray: the actor's handle and the check that Ray is up come from
:mod:`subagents.backends.ray`, which also makes the ``Worker`` actors.
"""

from __future__ import annotations

import copy
import itertools
import logging
import pickle
import uuid
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from typing import Any, Final

import anyio
import anyio.lowlevel
from anyio.lowlevel import RunVar

from ._ray_bridge import doorbell, when_done
from ._ray_wire import (
    CANCELLED,
    FAILED,
    REPLIED,
    ClusterLostError,
    Completion,
    Exported,
    RemoteRunnerError,
)

__all__ = ["Call", "Channel", "Slot"]

logger = logging.getLogger("subagents.backends.ray")

_BATCH: Final = 64
"""Calls past which a batch is sent without waiting for more, and the most one ``submit``
carries (a larger batch goes as several)."""
_QUIET: Final = 4
"""Turns of the event loop with no call joining after which a batch is sent."""


class Slot:
    """One actor of the pool, the calls it is running, and its channel in each loop.

    ``alive`` says whether Ray is up on the cluster the actor was made on: no call goes
    out when not.
    """

    __slots__ = ("__weakref__", "_alive", "actor", "busy", "ended")

    def __init__(self, actor: Any, alive: Callable[[], bool]) -> None:
        self.actor = actor
        self._alive = alive
        self.busy = 0
        self.ended = False
        """Whether the actor's ``serve`` call has ended (the actor died, or its runs' task
        group failed): it takes no more runs. Set from Ray's thread."""
        serving: Future[None] = actor.serve.remote().future()
        serving.add_done_callback(self._serving_ended)

    def up(self) -> bool:
        """Whether Ray is up on this actor's cluster."""
        return self._alive()

    def _serving_ended(self, _: Future[None]) -> None:
        # In Ray's thread: a flag the event loop reads, nothing that could wait.
        self.ended = True

    def channel(self) -> Channel:
        """This actor's channel in the current event loop."""
        channels = _CHANNELS.get(None)
        if channels is None:
            channels = weakref.WeakKeyDictionary()
            _CHANNELS.set(channels)
        channel = channels.get(self)
        if channel is None:
            channel = channels[self] = Channel(self.actor, self._alive)
        return channel


_CHANNELS: RunVar[weakref.WeakKeyDictionary[Slot, Channel]] = RunVar("subagents-ray-channels")


class Call:
    """One attempt sent through a channel; :attr:`done` is set once it ended."""

    __slots__ = ("_channel", "_error", "_reply", "done", "number")

    def __init__(self, channel: Channel, number: int) -> None:
        self._channel = channel
        self.number = number
        self.done = anyio.Event()
        self._reply: bytes | None = None
        self._error: BaseException | None = None

    def result(self) -> bytes:
        """The pickled ``Reply``, once done; else the error that ended the call."""
        if self._error is not None:
            raise self._error
        assert self._reply is not None, "the call has not ended"
        return self._reply

    def reply(self) -> bytes | None:
        """The pickled ``Reply`` if the call has ended with one."""
        return self._reply

    def cancel(self) -> None:
        """Ask the actor to cancel the run (it ends with no reply, or, if the runner
        ignores it, not at all)."""
        self._channel.cancel(self.number)

    def end(self, how: int, blob: bytes) -> None:
        if how == REPLIED:
            self._reply = blob
        elif how == FAILED:
            self._error = _exception(blob)
        elif how == CANCELLED:  # as the driver asked, or the actor is closing
            self._error = RemoteRunnerError("the run was cancelled on its actor")
        else:  # an actor of another version of this package
            self._error = RemoteRunnerError(f"the actor ended the run in an unknown way: {how}")
        self.done.set()

    def fail(self, error: BaseException) -> None:
        self._error = error
        self.done.set()


class Channel:
    """One event loop's calls to one actor."""

    def __init__(self, actor: Any, alive: Callable[[], bool]) -> None:
        self._actor = actor
        self._alive = alive
        self.name = uuid.uuid4().hex
        self._calls: dict[int, Call] = {}
        """The calls sent and not yet ended, by number."""
        self._batch: list[tuple[int, bytes]] = []
        """The calls of this turn of the loop, not yet sent."""
        self._numbers = itertools.count()
        self._collecting = False
        """Whether a ``collect`` call is pending."""
        self._into = doorbell()

    async def call(self, payload: bytes) -> Call:
        """Send one attempt (a pickled ``(target, request, shipped)``). The first of a
        batch sends it, shielded (it sends for all of them): once :data:`_QUIET` turns
        of the event loop pass with no other call joining, or :data:`_BATCH` have
        joined."""
        call = Call(self, next(self._numbers))
        self._calls[call.number] = call
        batch = self._batch
        batch.append((call.number, payload))
        if len(batch) == 1:
            # Children reach the backend over several turns (the manager starts its
            # workers one a turn, and each takes a few to get here), so a single turn
            # would gather one or two; a lone call waits a few idle turns, microseconds.
            joined, quiet = 1, 0
            while joined < _BATCH and quiet < _QUIET:
                await anyio.lowlevel.cancel_shielded_checkpoint()
                quiet = quiet + 1 if len(batch) == joined else 0
                joined = len(batch)
            self._send()
        return call

    def cancel(self, number: int) -> None:
        if not self._alive():
            self._lost()
            return
        try:
            self._actor.cancel.remote(self.name, [number])
        except Exception:  # the actor is gone: nothing left to cancel
            logger.debug("cancelling a child's call on its actor failed", exc_info=True)

    def _lost(self) -> None:
        """Ray has shut down: no answer will come, and no call may go out."""
        self._fail(list(self._calls), ClusterLostError("Ray shut down while the call ran"))

    def _send(self) -> None:
        batch, self._batch = self._batch, []
        for start in range(0, len(batch), _BATCH):
            self._submit(batch[start : start + _BATCH])
        self._collect()

    def _submit(self, batch: list[tuple[int, bytes]]) -> None:
        """One ``submit``; with no collect pending, it is the collect too (a lone call
        makes one Ray call, as a bare one does)."""
        numbers = [number for number, _ in batch]
        if not self._alive():
            self._lost()
            return
        collects = not self._collecting
        try:
            sent = self._actor.submit.remote(pickle.dumps((self.name, collects, batch), protocol=5))
        except Exception as exc:  # Ray shut down under us
            self._fail(numbers, exc)
            return
        if collects:
            self._collecting = True
            when_done(sent.future(), self._collected, self._into)
        else:
            # A submit that fails with its actor alive would otherwise leave its calls
            # waiting.
            when_done(sent.future(), partial(self._sent, numbers), self._into)

    def _sent(self, numbers: list[int], future: Future[None]) -> None:
        error = future.exception()
        if error is not None:
            self._fail(numbers, error)

    def _collect(self) -> None:
        """Keep one ``collect`` pending while any call runs."""
        if self._collecting or not self._calls:
            return
        if not self._alive():
            self._lost()
            return
        try:
            future: Future[bytes] = self._actor.collect.remote(self.name).future()
        except Exception as exc:  # Ray shut down under us
            self._fail(list(self._calls), exc)
            return
        self._collecting = True
        when_done(future, self._collected, self._into)

    def _collected(self, future: Future[bytes]) -> None:
        self._collecting = False
        error = future.exception()
        if error is not None:  # the actor is gone, and every call with it
            self._fail(list(self._calls), error)
            return
        try:
            ended: list[Completion] = list(pickle.loads(future.result()))
        except Exception as exc:  # an actor of another version of this package
            # Which calls it answered is unknown, and the actor has handed them over.
            self._fail(list(self._calls), exc)
            return
        try:
            for entry in ended:
                self._answer(entry)
        finally:
            self._collect()

    def _answer(self, entry: Completion) -> None:
        """Hand one call its end. An entry of another shape (an actor of another version
        of this package) ends the call it names with the error, or, naming none it can
        tell, every call of the channel: the actor has handed them over, and no call may
        wait for ever."""
        try:
            number, how, blob = entry
            call = self._calls.pop(number, None)
        except Exception as exc:
            named = entry[0] if isinstance(entry, (tuple, list)) and entry else None
            known = isinstance(named, int) and named in self._calls
            self._fail([named] if known else list(self._calls), exc)
            return
        if call is None:
            return
        try:
            call.end(how, blob)
        except Exception as exc:  # one call's answer must not strand the rest
            call.fail(exc)

    def _fail(self, numbers: list[int], error: BaseException) -> None:
        for number in numbers:
            call = self._calls.pop(number, None)
            if call is not None:
                call.fail(_copied(error))


def _copied(error: BaseException) -> BaseException:
    """A copy of ``error`` for each call it ends, so each raise keeps a traceback of its
    own; the error itself when it does not copy as itself (same type, same text)."""
    try:
        copied = copy.copy(error)
    except Exception:
        return error
    same = type(copied) is type(error) and str(copied) == str(error)
    return copied if same else error


def _exception(blob: bytes) -> BaseException:
    """The exception an actor's call failed with, outside its runner."""
    try:
        error: BaseException | Exported = pickle.loads(blob)
        return error.revive() if isinstance(error, Exported) else error
    except Exception as exc:
        return RemoteRunnerError(f"a call failed on its actor, and its error did not travel: {exc}")
