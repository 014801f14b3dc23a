"""Writes of a mailbox's overlay (puts, discards) by task id, the latest per id, in
submission order, with their sequence numbers sorted beside them."""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Generic, Protocol, TypeVar

__all__ = ["InOrder", "is_uncommitted"]


class _Keyed(Protocol):
    @property
    def task_id(self) -> str: ...

    @property
    def seq(self) -> int: ...


K = TypeVar("K", bound=_Keyed)


def is_uncommitted(put: _Keyed | None, committed: int) -> bool:
    """Whether ``put`` is a write whose batch is not committed at watermark ``committed``."""
    return put is not None and put.seq > committed


class InOrder(Generic[K]):
    """Puts (or discards) by task id (the latest per id) in submission order, with their
    sequence numbers sorted beside them, so that how many are past a watermark costs a
    bisection, not a walk over the committed ones whose report is still on its way (a
    whole batch on a busy store)."""

    __slots__ = ("_by_id", "_seqs")

    def __init__(self) -> None:
        self._by_id: dict[str, K] = {}
        self._seqs: list[int] = []

    def __bool__(self) -> bool:
        return bool(self._by_id)

    def __len__(self) -> int:
        return len(self._by_id)

    def get(self, task_id: str) -> K | None:
        return self._by_id.get(task_id)

    def values(self) -> Iterable[K]:
        return self._by_id.values()

    def first(self) -> K | None:
        return next(iter(self._by_id.values()), None)

    def uncommitted(self, committed: int) -> int:
        """How many are not committed at watermark ``committed``."""
        return len(self._seqs) - bisect.bisect_right(self._seqs, committed)

    def latest(self, put: K) -> K | None:
        """``put`` becomes its id's put, in its place by submission; returns the one it
        replaces."""
        old = self.pop(put.task_id)
        seqs = self._seqs
        if not seqs or seqs[-1] < put.seq:
            seqs.append(put.seq)
            self._by_id[put.task_id] = put
            return old
        # Only a put handed back after a failure arrives out of turn; timsort of a
        # nearly sorted dict is linear.
        bisect.insort(seqs, put.seq)
        self._by_id[put.task_id] = put
        self._by_id = dict(sorted(self._by_id.items(), key=lambda item: item[1].seq))
        return old

    def pop(self, task_id: str) -> K | None:
        put = self._by_id.pop(task_id, None)
        if put is not None:
            self._drop_seq(put)
        return put

    def forget(self, put: K) -> bool:
        """Remove ``put`` if it is still its id's put."""
        if self._by_id.get(put.task_id) is not put:
            return False
        del self._by_id[put.task_id]
        self._drop_seq(put)
        return True

    def _drop_seq(self, put: K) -> None:
        del self._seqs[bisect.bisect_left(self._seqs, put.seq)]

    def clear(self) -> None:
        self._by_id.clear()
        self._seqs.clear()
