"""Idempotency keys in memory: a repeat of ``spawn(..., idempotency_key=k)`` in the same
session returns the first spawn's handle and runs nothing, while that record is kept; a
repeat naming another agent or input is refused; the key is checked; the tools answer a
repeat with the existing task. (With a store: ``tests/store/test_store_idempotency.py``.)"""

from __future__ import annotations

import pytest

from subagents import (
    ConfigError,
    Request,
    RetryPolicy,
    RunContext,
    SpawnHandle,
    SpawnRejected,
    TransientError,
)
from subagents._events import SPAWNED
from subagents.tools import build_tools
from tests.helpers import Tracker, echo, has_record, manager_with, spec

pytestmark = pytest.mark.anyio


# ---------------------------------------------------------------- the same handle


async def test_a_repeat_while_running_returns_the_same_handle_and_runs_nothing() -> None:
    tracker = Tracker()
    async with manager_with(spec("slow", tracker.runner)) as m:
        first = m.spawn("slow", "a", idempotency_key="k")
        await tracker.entered.wait()
        again = m.spawn("slow", "a", idempotency_key="k")
        assert again is first
        assert again.state == "running"
        tracker.open()
        assert (await again.wait()).output == "done a"
        assert tracker.started == ["a"]
        assert m.statistics().spawned == 1
        assert m.tasks() == [first]


async def test_a_repeat_while_queued_returns_the_queued_handle() -> None:
    tracker = Tracker()
    async with manager_with(spec("slow", tracker.runner), max_concurrent_spawns=1) as m:
        m.spawn("slow", "busy")
        await tracker.entered.wait()
        queued = m.spawn("slow", "later", idempotency_key="k")
        assert queued.queue_position == 1
        assert m.spawn("slow", "later", idempotency_key="k") is queued
        assert m.statistics().queued == 1
        tracker.open()
        await queued.wait()
        assert tracker.started == ["busy", "later"]


async def test_a_repeat_after_the_end_returns_the_ended_handle_and_its_envelope() -> None:
    calls: list[str] = []

    async def counted(request: Request, ctx: RunContext) -> str:
        calls.append(request.input)
        return request.input.upper()

    async with manager_with(spec("echo", counted)) as m:
        first = m.spawn("echo", "hi", idempotency_key="k")
        envelope = await first.wait()
        again = m.spawn("echo", "hi", idempotency_key="k")
        assert again is first
        assert again.result is envelope
        assert again.collected
        assert calls == ["hi"]
        assert m.statistics().spawned == 1


async def test_a_repeat_publishes_no_spawned_event() -> None:
    async with manager_with(spec("echo", echo)) as m:
        spawned: list[str | None] = []
        m.events.subscribe(lambda e: spawned.append(e.task_id) if e.type == SPAWNED else None)
        handle = m.spawn("echo", "x", idempotency_key="k")
        m.spawn("echo", "x", idempotency_key="k")
        await handle.wait()
        assert spawned == [handle.task_id]


async def test_spawns_without_a_key_or_with_other_keys_each_run() -> None:
    async with manager_with(spec("echo", echo)) as m:
        handles = [
            m.spawn("echo", "x"),
            m.spawn("echo", "x"),
            m.spawn("echo", "x", idempotency_key="k1"),
            m.spawn("echo", "x", idempotency_key="k2"),
        ]
        assert len({h.task_id for h in handles}) == 4
        for handle in handles:
            await handle.wait()
        assert m.statistics().spawned == 4


async def test_the_same_key_in_another_session_runs_again() -> None:
    async with manager_with(spec("echo", echo)) as m:
        root = m.spawn("echo", "x", idempotency_key="k")
        other = m.spawn("echo", "x", session_id="other", idempotency_key="k")
        assert other is not root
        assert other.session_id == "other"
        await root.wait()
        await other.wait()
        assert m.spawn("echo", "x", session_id="other", idempotency_key="k") is other


async def test_only_agent_and_input_are_compared_the_other_arguments_of_a_repeat_are_not_used() -> (
    None
):
    async with manager_with(spec("echo", echo)) as m:
        first = m.spawn("echo", "x", name="w", timeout=5, idempotency_key="k")
        again = m.spawn("echo", "x", name="other", timeout=None, idempotency_key="k")
        assert again is first
        assert str(first.agent_path) == "/root/w"


async def test_a_repeat_returns_the_handle_once_its_session_is_closed() -> None:
    async with manager_with(spec("echo", echo)) as m:
        handle = m.spawn("echo", "x", session_id="s", idempotency_key="k")
        await handle.wait()
        await m.close_session("s")
        assert m.spawn("echo", "x", session_id="s", idempotency_key="k") is handle
        with pytest.raises(SpawnRejected) as caught:
            m.spawn("echo", "x", session_id="s", idempotency_key="new")
        assert caught.value.reason == "session_closed"


async def test_a_manager_not_running_refuses_a_keyed_spawn() -> None:
    manager = manager_with(spec("echo", echo))
    with pytest.raises(SpawnRejected) as caught:
        manager.spawn("echo", "x", idempotency_key="k")
    assert caught.value.reason == "manager_closed"
    async with manager as m:
        handle = m.spawn("echo", "x", idempotency_key="k")
        await handle.wait()
    with pytest.raises(SpawnRejected) as caught:
        manager.spawn("echo", "x", idempotency_key="k")
    assert caught.value.reason == "manager_closed"


# ---------------------------------------------------------------- conflicts and checks


@pytest.mark.parametrize(("agent", "text"), [("echo", "other input"), ("upper", "x")])
async def test_a_repeat_with_another_agent_or_input_is_refused(agent: str, text: str) -> None:
    async def upper(request: Request, ctx: RunContext) -> str:
        return request.input.upper()

    async with manager_with(spec("echo", echo), spec("upper", upper)) as m:
        first = m.spawn("echo", "x", idempotency_key="k-1")
        with pytest.raises(SpawnRejected) as caught:
            m.spawn(agent, text, idempotency_key="k-1")
        error = caught.value
        assert error.reason == "idempotency_conflict"
        assert error.task_id == first.task_id
        assert "'k-1'" in str(error)
        assert first.task_id in str(error)
        await first.wait()
        assert m.statistics().spawned == 1
        assert m.tasks() == [first]


@pytest.mark.parametrize("bad", ["", "k" * 257, 3, b"k", ["k"]])
async def test_a_malformed_key_is_a_config_error_naming_it(bad: object) -> None:
    async with manager_with(spec("echo", echo)) as m:
        with pytest.raises(ConfigError) as caught:
            m.spawn("echo", "x", idempotency_key=bad)  # type: ignore[arg-type]
        assert caught.value.field == "idempotency_key"
        assert "idempotency_key must be a non-empty string of at most 256" in str(caught.value)
        assert m.statistics().spawned == 0


async def test_keys_up_to_256_characters_and_str_subclasses_are_taken() -> None:
    class Key(str):
        def __eq__(self, other: object) -> bool:
            raise AssertionError("the key's own __eq__ is never called")

        __hash__ = str.__hash__

    async with manager_with(spec("echo", echo)) as m:
        long = m.spawn("echo", "x", idempotency_key="k" * 256)
        assert m.spawn("echo", "x", idempotency_key="k" * 256) is long
        sub = m.spawn("echo", "x", idempotency_key=Key("sub"))
        assert m.spawn("echo", "x", idempotency_key="sub") is sub
        await long.wait()
        await sub.wait()


async def test_an_unknown_agent_is_reported_before_the_key_is_looked_at() -> None:
    async with manager_with(spec("echo", echo)) as m:
        handle = m.spawn("echo", "x", idempotency_key="k")
        with pytest.raises(LookupError, match="nope"):
            m.spawn("nope", "x", idempotency_key="k")
        with pytest.raises(ConfigError, match="input"):
            m.spawn("echo", 3, idempotency_key="k")  # type: ignore[arg-type]
        await handle.wait()


# ---------------------------------------------------------------- the key's lifetime


async def test_forgetting_the_record_frees_its_key() -> None:
    async with manager_with(spec("echo", echo)) as m:
        first = m.spawn("echo", "x", idempotency_key="k")
        await first.wait()
        m.forget(first.task_id)
        second = m.spawn("echo", "other input", idempotency_key="k")  # no conflict now
        assert second.task_id != first.task_id
        assert (await second.wait()).output == "other input"
        assert m.spawn("echo", "other input", idempotency_key="k") is second


async def test_retention_eviction_frees_the_key() -> None:
    async with manager_with(spec("echo", echo), retain_collected=1) as m:
        first = m.spawn("echo", "x", idempotency_key="k")
        await first.wait()
        assert m.spawn("echo", "x", idempotency_key="k") is first  # kept: the newest
        await m.spawn("echo", "y").wait()  # evicts the record of the first
        assert not has_record(m, first)
        second = m.spawn("echo", "x", idempotency_key="k")
        assert second is not first
        await second.wait()
        assert m.statistics().spawned == 3


async def test_a_child_forgotten_with_its_parent_frees_its_key_in_the_parents_session() -> None:
    grandchildren: list[SpawnHandle] = []

    async def parent(request: Request, ctx: RunContext) -> str:
        grandchild = ctx.spawn("echo", "g", idempotency_key="g")
        assert ctx.spawn("echo", "g", idempotency_key="g") is grandchild
        grandchildren.append(grandchild)
        await grandchild.wait()
        return "parent done"

    async with manager_with(spec("echo", echo), spec("parent", parent)) as m:
        handle = m.spawn("parent", "p")
        await handle.wait()
        m.forget(handle.task_id)
        assert not has_record(m, grandchildren[0])
        # private: the sessions' key index; no public API lists keys.
        assert m._sessions.keyed(handle.task_id, "g") is None


async def test_a_retried_attempt_gets_the_grandchild_its_first_attempt_spawned() -> None:
    spawned: list[SpawnHandle] = []

    async def flaky(request: Request, ctx: RunContext) -> str:
        spawned.append(ctx.spawn("echo", "g", idempotency_key="step-1"))
        if ctx.attempt == 1:
            raise TransientError("try again")
        return (await spawned[-1].wait()).output

    retry = RetryPolicy(attempts=2, initial=0.001, maximum=0.001, jitter=0)
    async with manager_with(spec("echo", echo), spec("flaky", flaky, retry=retry)) as m:
        envelope = await m.spawn("flaky", "p").wait()
        assert envelope.output == "g"
        assert envelope.attempts == 2
        assert spawned[0] is spawned[1]
        assert m.statistics().spawned == 2  # the parent and one grandchild


# ---------------------------------------------------------------- the tools


async def test_spawn_agent_with_a_repeated_key_answers_with_the_existing_task() -> None:
    tracker = Tracker()
    async with manager_with(spec("slow", tracker.runner)) as m:
        tools = build_tools(m, "root")
        args = {"agent": "slow", "input": "a", "idempotency_key": "step-1"}
        first = await tools["spawn_agent"].execute(args)
        assert not first.is_error
        assert first.details["existing"] is False
        await tracker.entered.wait()
        again = await tools["spawn_agent"].execute(args)
        assert not again.is_error
        task_id = first.details["task_id"]
        assert again.details["task_id"] == task_id
        assert again.details["existing"] is True
        assert again.details["status"] == "running"
        assert "already spawned" in again.content
        assert "nothing new was started" in again.content
        tracker.open()
        await m.handle(str(task_id)).wait()
        ended = await tools["spawn_agent"].execute(args)
        assert ended.details["existing"] is True
        assert ended.details["status"] == "completed"
        assert tracker.started == ["a"]


async def test_spawn_agent_with_a_conflicting_key_returns_the_holder_as_data() -> None:
    async with manager_with(spec("echo", echo)) as m:
        tools = build_tools(m, "root")
        first = await tools["spawn_agent"].execute(
            {"agent": "echo", "input": "a", "idempotency_key": "k"}
        )
        refused = await tools["spawn_agent"].execute(
            {"agent": "echo", "input": "b", "idempotency_key": "k"}
        )
        assert refused.is_error
        assert refused.details == {
            "error": "spawn_rejected",
            "reason": "idempotency_conflict",
            "task_id": first.details["task_id"],
        }
        assert "new idempotency_key" in refused.content
        await m.handle(str(first.details["task_id"])).wait()


@pytest.mark.parametrize("bad", ["", "k" * 257, 5])
async def test_spawn_agent_refuses_a_malformed_key_as_an_invalid_argument(bad: object) -> None:
    async with manager_with(spec("echo", echo)) as m:
        tools = build_tools(m, "root")
        result = await tools["spawn_agent"].execute(
            {"agent": "echo", "input": "a", "idempotency_key": bad}
        )
        assert result.is_error
        assert result.details["error"] == "invalid_arguments"
        assert result.details["field"] == "idempotency_key"
        assert m.statistics().spawned == 0


async def test_the_spawn_agent_schema_describes_the_key() -> None:
    async with manager_with(spec("echo", echo)) as m:
        schema = build_tools(m, "root")["spawn_agent"].input_schema
        properties = schema["properties"]
        assert isinstance(properties, dict)
        key = properties["idempotency_key"]
        assert key["anyOf"][0] == {"type": "string", "minLength": 1, "maxLength": 256}  # type: ignore[index]
        assert "idempotency_key" not in schema["required"]  # type: ignore[operator]
