"""The ``on_message`` responders: a busy child answering a question on the side.

When an awaited message arrives for a running child that is not waiting for it, its
``AgentSpec(on_message=...)`` responder takes it and runs in the manager's task group,
cancelled at the asker's deadline, when the asker stops waiting, or when the agent ends
(design/messaging.md, "A busy recipient can still answer").
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import anyio

from ._envelope import plain_str
from ._errors import ConfigError
from ._messages import Message, message_body
from ._peers import Peer
from ._router import Postbox

__all__ = ["Responders"]

logger = logging.getLogger("subagents.messages")

StartTask = Callable[[Callable[[], Coroutine[Any, Any, None]]], None]
Answer = Callable[[str, Message, str], Message]
"""``answer(address, question, body)``: send the reply of ``address`` to ``question``."""


class Responders:
    """The responders of one manager's running children.

    Args:
        postbox: the inboxes.
        awaited: asked message ids -> the asker's deadline and the address asked (the
            messaging's, shared).
        start_task: runs a responder in the manager's task group.
        answer: sends a responder's reply.
    """

    def __init__(
        self,
        postbox: Postbox,
        awaited: dict[str, tuple[float, str]],
        start_task: StartTask,
        answer: Answer,
    ) -> None:
        self._postbox, self._awaited = postbox, awaited
        self._start_task, self._answer = start_task, answer
        # The RunContext of each running child with a responder (typed loosely: the
        # context module sits above this one).
        self.contexts: dict[str, Any] = {}
        # Running responders: address -> asked message id -> the responder's scope.
        self._running: dict[str, dict[str, anyio.CancelScope]] = {}

    def ended(self, task_id: str) -> None:
        """``task_id`` ended: its responders stop (nobody can use what they would answer)."""
        if self.contexts:
            self.contexts.pop(task_id, None)
        if self._running:
            for scope in self._running.pop(task_id, {}).values():
                scope.cancel()

    def stop(self, address: str, message_id: str) -> None:
        """The asker of ``message_id`` stopped waiting: the responder of ``address`` for
        it, if any, stops."""
        if self._running:
            scope = self._running.get(address, {}).get(message_id)
            if scope is not None:
                scope.cancel()

    def maybe_respond(self, peer: Peer, message: Message) -> None:
        """Let ``peer``'s responder answer ``message`` now, if it has one and runs."""
        record = peer.record
        if record is None or record.spec.on_message is None:
            return
        ctx = self.contexts.get(peer.address)
        if ctx is None:
            return  # still queued: its runner reads it once it starts
        taken = self._postbox.take_one(peer.address, message.id)
        if taken is None:
            return
        self._postbox.read(*taken, "injected")  # the responder reads it, on the side
        responder = record.spec.on_message
        deadline = self._awaited.get(message.id, (float("inf"), ""))[0]

        async def respond() -> None:
            await self._respond(peer.address, responder, message, ctx, deadline)

        self._start_task(respond)

    async def _respond(
        self,
        address: str,
        responder: Callable[[Message, Any], Awaitable[str | None]],
        message: Message,
        ctx: object,
        deadline: float,
    ) -> None:
        answer: object = None
        if message.id not in self._awaited or address not in self.contexts:
            return  # its asker, or its agent, is gone already: nobody would read an answer
        # Cancelled when its asker stops waiting or its agent ends, and at the deadline.
        scope = anyio.CancelScope(deadline=deadline)
        running = self._running.setdefault(address, {})
        running[message.id] = scope
        try:
            with scope:
                try:
                    answer = await responder(message, ctx)
                except Exception:
                    logger.exception("the on_message responder of %s raised; no reply", address)
        finally:
            running.pop(message.id, None)
            if not running and self._running.get(address) is running:
                del self._running[address]
        reply = None
        text = plain_str(answer) if answer is not None else None
        if text and text.strip() and address in self.contexts:
            try:
                body = message_body(text)
            except ConfigError as exc:
                logger.warning("the on_message responder of %s answered badly: %s", address, exc)
            else:
                reply = self._answer(address, message, body)
        self._postbox.aside(address, message, reply)
