"""The overlay's ordered index of puts: by task id, in submission order, and how many are
past a watermark, checked against a plain model under any sequence of operations."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from subagents import DelegateResult, Status
from subagents.store._in_order import InOrder
from subagents.store._pending import Put

IDS = st.sampled_from(["a", "b", "c", "d", "e"])


def put_of(task_id: str, seq: int) -> Put:
    envelope = DelegateResult(agent="noop", task_id=task_id, status=Status.COMPLETED, output="ok")
    put = Put(
        session="s",
        recipient="",
        origin="o",
        task_id=task_id,
        envelope=envelope,
        stored_at=0.0,
        expires_at=None,
        on_written=lambda put: None,
    )
    put.seq = seq
    return put


class InOrderAgainstModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.index: InOrder[Put] = InOrder()
        self.model: dict[str, Put] = {}
        self.seq = 0
        self.made: list[Put] = []

    @rule(task_id=IDS)
    def latest(self, task_id: str) -> None:
        self.seq += 1
        put = put_of(task_id, self.seq)
        self.made.append(put)
        self.index.latest(put)
        self.model.pop(task_id, None)
        self.model[task_id] = put

    @rule(data=st.data())
    def latest_out_of_turn(self, data: st.DataObject) -> None:
        """A put handed back after a failure comes in again with its old number."""
        if not self.made:
            return
        put = data.draw(st.sampled_from(self.made))
        self.index.latest(put)
        self.model.pop(put.task_id, None)
        self.model[put.task_id] = put
        self.model = dict(sorted(self.model.items(), key=lambda item: item[1].seq))

    @rule(task_id=IDS)
    def pop(self, task_id: str) -> None:
        assert self.index.pop(task_id) is self.model.pop(task_id, None)

    @rule(data=st.data())
    def forget(self, data: st.DataObject) -> None:
        if not self.made:
            return
        put = data.draw(st.sampled_from(self.made))
        held = self.model.get(put.task_id) is put
        assert self.index.forget(put) is held
        if held:
            del self.model[put.task_id]

    @rule()
    def clear(self) -> None:
        self.index.clear()
        self.model.clear()

    @invariant()
    def same_puts_in_submission_order(self) -> None:
        assert list(self.index.values()) == list(self.model.values())
        assert len(self.index) == len(self.model)
        assert bool(self.index) is bool(self.model)
        assert self.index.first() is next(iter(self.model.values()), None)
        seqs = [put.seq for put in self.index.values()]
        assert seqs == sorted(seqs)

    @invariant()
    def uncommitted_counts_those_past_each_watermark(self) -> None:
        for committed in range(self.seq + 2):
            expected = sum(1 for put in self.model.values() if put.seq > committed)
            assert self.index.uncommitted(committed) == expected


TestInOrderAgainstModel = InOrderAgainstModel.TestCase
