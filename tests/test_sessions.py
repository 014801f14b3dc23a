"""The sessions part on its own: the record index, unknown-id help, closing, names,
mailboxes and the retention of collected records."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager, nullcontext

import pytest

from subagents import AgentSpec, Request, RunContext, SpawnRejected, UnknownTask
from subagents._envelope import DelegateResult, Status
from subagents._mailbox import BaseMailbox, Mailbox
from subagents._paths import AgentPath
from subagents._permissions import Ruleset
from subagents._record import RUNNING, SETTLED, ChildRecord
from subagents._sessions import CLOSED_MEMORY, Sessions


async def _never(request: Request, ctx: RunContext) -> str:
    raise AssertionError("no runner runs here")


_SPEC = AgentSpec(name="child", description="A record for the sessions.", runner=_never)


def _no_lend() -> AbstractAsyncContextManager[None]:
    return nullcontext()


def sessions(retain: int | None = None) -> Sessions:
    made = Sessions(lambda sid: Mailbox(capacity=8), _no_lend, retain)
    made.accepting = True
    return made


def record(task_id: str, session_id: str = "root") -> ChildRecord:
    return ChildRecord(
        task_id=task_id,
        session_id=session_id,
        root_session=session_id,
        spec=_SPEC,
        request=Request(agent="child", input=""),
        agent_path=AgentPath(f"/root/{task_id}"),
        parent_path=AgentPath.root(),
        timeout=None,
        permissions=Ruleset(),
        spawned_at=0.0,
        sync=False,
    )


def end(s: Sessions, r: ChildRecord) -> DelegateResult:
    """What the child runner does as a child ends: envelope, out of the live set, delivered."""
    envelope = DelegateResult(agent="child", task_id=r.task_id, status=Status.COMPLETED)
    r.envelope = envelope
    r.state = SETTLED
    s.ended(r)
    mailbox = s.delivery_mailbox(r.session_id)
    if mailbox is not None:
        mailbox.put(r.task_id, envelope)
    s.delivered(r)
    return envelope


def test_records_are_listed_by_session_oldest_first() -> None:
    s = sessions()
    a, b, c = record("aaa111"), record("bbb222", "other"), record("ccc333")
    for r in (a, b, c):
        s.add(r)
    assert s.listing("root") == [a, c]
    assert s.listing("other") == [b]
    assert s.get("bbb222") is b
    assert s.require("aaa111", "root") is a


def test_an_unknown_id_names_the_id_probably_meant() -> None:
    s = sessions()
    s.add(record("a1b2c3d4e5f6"))
    with pytest.raises(UnknownTask) as caught:
        s.require("a1b2c3d4e5")  # truncated
    assert "a1b2c3d4e5f6" in str(caught.value)


def test_another_sessions_id_says_whose_it_is() -> None:
    s = sessions()
    s.add(record("a1b2c3d4e5f6", "other"))
    with pytest.raises(UnknownTask, match="another session"):
        s.require("a1b2c3d4e5f6", "root")


def test_a_closed_session_takes_no_children_and_its_mailbox_reads_as_dropped() -> None:
    s = sessions()
    s.mailbox("conv")
    assert s.start_closing("conv") == []
    with pytest.raises(SpawnRejected, match="closed"):
        s.check_open("conv")
    s.finish_closing("conv")
    assert s.mailbox("conv").closed
    assert s.is_closed("conv")


def test_closing_wakes_its_watchers_once() -> None:
    s = sessions()
    woken: list[str] = []
    s.watch_close("conv", lambda: woken.append("a"))
    token = s.watch_close("conv", lambda: woken.append("b"))
    s.unwatch_close("conv", token)
    s.start_closing("conv")
    s.start_closing("conv")
    assert woken == ["a"]


def test_a_running_childs_session_is_open_and_owned() -> None:
    s = sessions()
    parent = record("p00001")
    s.add(parent)
    parent.state = RUNNING
    parent.scope = object()  # type: ignore[assignment]  # any scope: the runner runs
    assert s.check_open("p00001") is parent
    assert parent.owns_session
    parent.state = SETTLED
    parent.scope = None
    with pytest.raises(SpawnRejected, match="can no longer delegate"):
        s.check_open("p00001")


def test_names_in_one_session_get_suffixes() -> None:
    s = sessions()
    assert [s.allocate_name("root", "general") for _ in range(3)] == [
        "general",
        "general-2",
        "general-3",
    ]
    assert s.allocate_name("other", "general") == "general"


def test_a_drained_envelope_counts_as_collected() -> None:
    s = sessions()
    r = record("r00001")
    s.add(r)
    end(s, r)
    mailbox: BaseMailbox = s.mailbox("root")
    assert not r.collected
    assert mailbox.drain("r00001") is not None
    assert r.collected


def test_retain_zero_forgets_a_record_as_it_is_collected() -> None:
    s = sessions(retain=0)
    r = record("r00001")
    s.add(r)
    end(s, r)
    s.collect(r)
    assert s.get("r00001") is None
    assert s.listing("root") == []


def test_retention_keeps_the_newest_collected_records() -> None:
    s = sessions(retain=2)
    records = [record(f"r{i:05}") for i in range(4)]
    for r in records:
        s.add(r)
        end(s, r)
        s.collect(r)
    assert s.listing("root") == records[2:]


def test_forget_takes_the_envelope_out_of_the_mailbox() -> None:
    s = sessions()
    r = record("r00001")
    s.add(r)
    end(s, r)
    s.forget(r)
    assert s.get("r00001") is None
    assert len(s.mailbox("root")) == 0


def test_closed_sessions_with_no_record_are_remembered_up_to_a_bound() -> None:
    s = sessions()
    for i in range(CLOSED_MEMORY + 1):
        s.start_closing(f"conv-{i}")
        s.finish_closing(f"conv-{i}")
    assert not s.is_closed("conv-0")  # the oldest is forgotten like a name never used
    assert s.is_closed(f"conv-{CLOSED_MEMORY}")
