"""The in-memory Mailbox against a plain ordered-dict model (hypothesis): a state machine
over every operation, and the ``consumed`` hook under TTL, overwrites and a drop."""

from __future__ import annotations

import anyio
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from subagents import DelegateResult, Mailbox, MailboxFull, Status

KEYS = st.sampled_from(["a", "b", "c", "d", "e", "f"])
CAPACITY = 4
TTL = 10.0


def env(task_id: str, n: int) -> DelegateResult:
    return DelegateResult(
        agent="w", task_id=task_id, status=Status.COMPLETED, output=str(n), timestamp_ms=1
    )


class MailboxModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.box = Mailbox(capacity=CAPACITY, ttl=TTL, clock=lambda: self.now)
        # model: key -> (envelope, expiry), dict order is arrival order
        self.entries: dict[str, tuple[DelegateResult, float]] = {}
        self.closed = False
        self.counter = 0
        self.once_fired: dict[str, int] = {}
        self.once_expected: dict[str, int] = {}
        self.all_fired = 0
        self.all_expected = 0
        self.all_sub: str | None = None
        self.once_pending: set[str] = set()

    def expire(self) -> None:
        self.entries = {k: v for k, v in self.entries.items() if v[1] > self.now}

    @rule(key=KEYS)
    def put(self, key: str) -> None:
        self.counter += 1
        envelope = env(key, self.counter)
        self.expire()
        if self.closed:
            assert self.box.put(key, envelope) is False
            return
        if key not in self.entries and len(self.entries) >= CAPACITY:
            try:
                self.box.put(key, envelope)
            except MailboxFull:
                return
            raise AssertionError("put beyond capacity did not raise MailboxFull")
        assert self.box.put(key, envelope) is True
        self.entries.pop(key, None)
        self.entries[key] = (envelope, self.now + TTL)
        if key in self.once_pending:
            self.once_expected[key] += 1
            self.once_pending.discard(key)
        if self.all_sub is not None:
            self.all_expected += 1

    @rule(key=KEYS)
    def peek(self, key: str) -> None:
        self.expire()
        expected = self.entries.get(key)
        assert self.box.peek(key) == (expected[0] if expected else None)

    @rule(key=KEYS)
    def drain(self, key: str) -> None:
        self.expire()
        expected = self.entries.pop(key, None)
        assert self.box.drain(key) == (expected[0] if expected else None)

    @rule(key=KEYS)
    def wait_nowait(self, key: str) -> None:
        self.expire()
        expected = self.entries.pop(key, None)
        got = anyio.run(self.box.wait, key, 0)
        assert got == (expected[0] if expected else None)

    @rule()
    def drain_all(self) -> None:
        self.expire()
        expected = [e for e, _ in self.entries.values()]
        self.entries.clear()
        assert self.box.drain_all() == expected

    @rule(seconds=st.sampled_from([0.5, 3.0, 10.0]))
    def tick(self, seconds: float) -> None:
        self.now += seconds

    @precondition(lambda self: not self.closed)
    @rule(key=KEYS)
    def subscribe_once(self, key: str) -> None:
        if key in self.once_pending:
            return  # one subscription per key in this model
        self.expire()
        fired_at_once = key in self.entries
        self.once_fired.setdefault(key, 0)
        self.once_expected.setdefault(key, 0)

        def callback() -> None:
            self.once_fired[key] += 1

        sub = self.box.subscribe_once(key, callback)
        if fired_at_once:
            assert sub is None
            self.once_expected[key] += 1
        else:
            assert sub is not None
            self.once_pending.add(key)

    @precondition(lambda self: self.all_sub is None and not self.closed)
    @rule()
    def subscribe_all(self) -> None:
        def callback() -> None:
            self.all_fired += 1

        self.all_sub = self.box.subscribe_all(callback)

    @precondition(lambda self: self.all_sub is not None)
    @rule()
    def unsubscribe_all(self) -> None:
        self.box.unsubscribe(self.all_sub)
        self.all_sub = None

    @rule()
    def drop(self) -> None:
        if not self.closed:
            for key in self.once_pending:
                self.once_expected[key] += 1  # dropped: pending waiters are woken
            self.once_pending.clear()
            if self.all_sub is not None:
                self.all_expected += 1
                self.all_sub = None
        self.box.drop()
        self.closed = True
        self.entries.clear()

    @invariant()
    def same_length(self) -> None:
        self.expire()
        assert len(self.box) == len(self.entries)
        assert len(self.box) <= CAPACITY

    @invariant()
    def same_signals(self) -> None:
        assert self.once_fired == self.once_expected
        assert self.all_fired == self.all_expected
        assert self.box.closed == self.closed


MailboxModel.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_mailbox_matches_model = MailboxModel.TestCase


# ---------------------------------------------------------------- the consumed hook

_MAILBOX_OPS = st.lists(
    st.tuples(
        st.sampled_from(
            ["put", "put", "put", "tick", "tick", "peek", "drain", "drain_all", "wait", "len"]
        ),
        st.sampled_from(["a", "b", "c"]),
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(ops=_MAILBOX_OPS, drop_at=st.none() | st.integers(min_value=0, max_value=30))
@example(ops=[("put", "a"), ("tick", "a"), ("tick", "a"), ("drain_all", "a")], drop_at=None)
@example(
    ops=[("put", "a"), ("tick", "a"), ("put", "a"), ("tick", "a"), ("drain", "a")], drop_at=None
)
def test_the_consumed_hook_sees_exactly_what_is_handed_out(
    ops: list[tuple[str, str]], drop_at: int | None
) -> None:
    """With a TTL, overwrites of the same id, expiry and a drop: ``consumed`` is called once
    for each envelope ``drain``/``drain_all``/``wait`` return and never otherwise (not on
    peek, expiry, an overwrite or the drop), and ``len`` counts the unexpired entries."""
    now = [0.0]
    box = Mailbox(capacity=8, ttl=2.0, clock=lambda: now[0])
    hooked: list[DelegateResult] = []
    box.consumed = hooked.append
    handed: list[DelegateResult] = []
    model: dict[str, tuple[DelegateResult, float]] = {}
    for i, (op, key) in enumerate(ops):
        if i == drop_at:
            box.drop()
            model.clear()
        model = {k: v for k, v in model.items() if v[1] > now[0]}
        if op == "put":
            envelope = DelegateResult(
                agent="w", task_id=key, status=Status.COMPLETED, output=str(i)
            )
            assert box.put(key, envelope) is not box.closed
            if not box.closed:
                model.pop(key, None)
                model[key] = (envelope, now[0] + 2.0)
        elif op == "peek":
            assert box.peek(key) is (model[key][0] if key in model else None)
        elif op == "drain":
            got = box.drain(key)
            assert got is (model.pop(key)[0] if key in model else None)
            if got is not None:
                handed.append(got)
        elif op == "drain_all":
            got_all = box.drain_all()
            assert got_all == [envelope for envelope, _ in model.values()]
            model.clear()
            handed.extend(got_all)
        elif op == "wait":
            got = anyio.run(box.wait, key, 0)
            assert got is (model.pop(key)[0] if key in model else None)
            if got is not None:
                handed.append(got)
        elif op == "tick":
            now[0] += 1.5
        else:
            assert len(box) == len(model)
        assert hooked == handed
