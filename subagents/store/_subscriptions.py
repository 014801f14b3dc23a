"""A mailbox's subscriptions: one-shot per task id, and all-puts signals.

The registry :class:`~subagents.Mailbox` keeps, for a mailbox whose entries live
elsewhere: the durable mailbox fires it on its own puts at once and on other processes'
puts when the store's watcher sees them. Callbacks run in registration order; one that
raises is logged and ignored; one may (un)subscribe, put or drain while others run.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable

from .._mailbox import Signal

__all__ = ["Subscriptions"]

logger = logging.getLogger("subagents.mailbox")


def fire(callbacks: Iterable[Signal]) -> None:
    """Run callbacks in order; one that raises is logged and never breaks the caller."""
    for callback in callbacks:
        try:
            callback()
        except Exception:
            logger.exception("mailbox subscriber %r raised; ignored", callback)


class Subscriptions:
    """Subscriptions of one mailbox; ``on_active(bool)`` is told when the first one is
    added and when the last one goes (so the store polls only while someone listens)."""

    def __init__(self, on_active: Callable[[bool], object]) -> None:
        self._on_active = on_active
        self._task: dict[str, dict[str, Signal]] = {}
        self._sub_task: dict[str, str] = {}
        self._all: dict[str, Signal] = {}
        # What a put fires: a snapshot, so a callback may unsubscribe while they run.
        self._all_fire: tuple[Signal, ...] = ()
        self._ids = itertools.count(1)
        self._active = False

    @property
    def task_count(self) -> int:
        return len(self._sub_task)

    @property
    def all_count(self) -> int:
        return len(self._all)

    def waits(self, task_id: str) -> bool:
        """Whether ``task_id`` has a one-shot subscription."""
        return task_id in self._task

    def task_ids(self) -> list[str]:
        """The task ids someone waits for."""
        return list(self._task)

    def _changed(self) -> None:
        active = bool(self._sub_task or self._all)
        if active != self._active:
            self._active = active
            self._on_active(active)

    def add_once(self, task_id: str, callback: Signal) -> str:
        sub_id = f"t{next(self._ids)}"
        self._task.setdefault(task_id, {})[sub_id] = callback
        self._sub_task[sub_id] = task_id
        self._changed()
        return sub_id

    def add_all(self, callback: Signal) -> str:
        sub_id = f"a{next(self._ids)}"
        self._all[sub_id] = callback
        self._all_fire = tuple(self._all.values())
        self._changed()
        return sub_id

    def new_id(self) -> str:
        """An id for a subscription fired at once and never registered."""
        return f"a{next(self._ids)}"

    def remove(self, sub_id: str | None) -> None:
        if sub_id is None:
            return
        if self._all.pop(sub_id, None) is not None:
            self._all_fire = tuple(self._all.values())
        else:
            task_id = self._sub_task.pop(sub_id, None)
            if task_id is None:
                return
            subs = self._task.get(task_id)
            if subs is not None:
                subs.pop(sub_id, None)
                if not subs:
                    del self._task[task_id]
        self._changed()

    def fire_tasks(self, task_ids: Iterable[str]) -> None:
        """Fire (and remove) the one-shot subscriptions of ``task_ids``."""
        callbacks: list[Signal] = []
        for task_id in task_ids:
            waiting = self._task.pop(task_id, None)
            if waiting:
                for sub_id in waiting:
                    del self._sub_task[sub_id]
                callbacks.extend(waiting.values())
        if callbacks:
            self._changed()
            fire(callbacks)

    def fire_all(self) -> None:
        if self._all_fire:
            fire(self._all_fire)

    def fire_arrived(self, task_ids: Iterable[str]) -> None:
        """Entries of ``task_ids`` arrived: their one-shot subscriptions, then every put's."""
        self.fire_tasks(task_ids)
        self.fire_all()

    def fire_drop(self) -> None:
        """Fire and remove everything."""
        callbacks = [cb for subs in self._task.values() for cb in subs.values()]
        callbacks.extend(self._all.values())
        self._task.clear()
        self._sub_task.clear()
        self._all.clear()
        self._all_fire = ()
        self._changed()
        fire(callbacks)
