"""The opt-in re-run after a restart: a root spawn of an agent with ``resume="rerun"`` that
a killed process left unfinished runs again in the manager that recovers it, under its old
task id, path and request; ``attempts`` counts every try (committed before the runner
runs), and once ``max_attempts`` tries have all ended with their process, the spawn ends
in one ``Interrupted`` envelope instead (the poison-pill guard). Never two envelopes."""

from __future__ import annotations

import signal
from pathlib import Path

import anyio
import pytest

from subagents import AgentSpec, Request, RunContext, Status, SubagentConfig, SubagentManager
from subagents.store import INTERRUPTED, SqliteStore
from tests.store.support import sqlite, worker, write_locked

pytestmark = pytest.mark.anyio


async def _killed_while_running(path: Path, mode: str, backend: str, cap: int = 3) -> str:
    """Run ``worker.py rerun`` until its child has started (its try counted), then
    SIGKILL it; returns the child's task id."""
    async with worker("rerun", str(path), mode, str(cap), backend=backend) as proc:
        seen: dict[str, str] = {}
        with anyio.fail_after(30):
            # "J" (journaled) and "S" (its try started) come in either order.
            while "S" not in seen or (mode == "spawn" and "J" not in seen):
                kind, task_id = (await proc.line()).split()
                seen[kind] = task_id
        started = seen["S"]
        assert mode != "spawn" or started == seen["J"]
        proc.process.send_signal(signal.SIGKILL)
        proc.killed = True
    return started


def _row(path: Path, task_id: str) -> tuple[str, int, int]:
    """The task's state and attempts, and how many envelopes it has."""
    with sqlite(path) as conn:
        state, attempts = conn.execute(
            "SELECT state, attempts FROM tasks WHERE task_id = ?", (task_id,)
        ).fetchone()
        (envelopes,) = conn.execute(
            "SELECT count(*) FROM envelopes WHERE task_id = ?", (task_id,)
        ).fetchone()
    return str(state), int(attempts), int(envelopes)


class Finisher:
    """A ``stuck`` agent that finishes this time, counting its runs."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, str]] = []

    async def __call__(self, request: Request, ctx: RunContext) -> str:
        self.runs.append((ctx.task_id, request.input))
        return f"done at last: {request.input}"


async def test_a_killed_rerun_spawn_runs_again_under_its_old_id(
    tmp_path: Path, anyio_backend: str
) -> None:
    path = tmp_path / "r.db"
    task_id = await _killed_while_running(path, "spawn", anyio_backend)
    assert _row(path, task_id) == ("running", 1, 0)
    finisher = Finisher()
    spec = AgentSpec(name="stuck", runner=finisher, resume="rerun")
    async with SubagentManager([spec], config=SubagentConfig(store_path=path)) as m:
        # Its idempotency key is its own again: a repeat is the rerun, not a new spawn.
        assert m.spawn("stuck", "the input", idempotency_key="k").task_id == task_id
        with anyio.fail_after(30):
            envelope = await m.wait_result(task_id)
        assert envelope is not None
        assert envelope.status is Status.COMPLETED
        assert envelope.output == "done at last: the input"
        assert str(envelope.agent_path) == "/root/stuck"
        assert [h.task_id for h in m.tasks()] == [task_id]
    assert finisher.runs == [(task_id, "the input")]
    assert _row(path, task_id) == ("ended", 2, 1)
    # A second restart finds nothing to do: no third run, no second envelope.
    async with SubagentManager([spec], config=SubagentConfig(store_path=path)) as m:
        assert m.tasks() == []
    assert finisher.runs == [(task_id, "the input")]
    assert _row(path, task_id) == ("ended", 2, 1)


async def test_a_spawn_whose_every_try_dies_ends_interrupted_at_the_cap(
    tmp_path: Path, anyio_backend: str
) -> None:
    path = tmp_path / "p.db"
    task_id = await _killed_while_running(path, "spawn", anyio_backend, cap=2)
    # The restart runs it again, and that process dies too.
    assert await _killed_while_running(path, "wait", anyio_backend, cap=2) == task_id
    assert _row(path, task_id) == ("running", 2, 0)
    finisher = Finisher()
    spec = AgentSpec(name="stuck", runner=finisher, resume="rerun", max_attempts=2)
    async with SubagentManager([spec], config=SubagentConfig(store_path=path)) as m:
        envelope = await m.wait_result(task_id, timeout=0)
    assert finisher.runs == []  # two tries, both died: not a third
    assert envelope is not None
    assert envelope.status is Status.ERROR
    assert envelope.error_type == INTERRUPTED
    assert "2 times" in envelope.error
    assert _row(path, task_id) == ("ended", 2, 1)


async def test_a_rerun_parent_starts_afresh_in_its_session(
    tmp_path: Path, anyio_backend: str
) -> None:
    """What the dead try's child left in the parent's session (its ``Interrupted``
    envelope unread, its idempotency key, its name) does not reach the new try: it
    delegates anew, under a new name."""
    path = tmp_path / "parent.db"
    async with worker("parent", str(path), backend=anyio_backend) as proc:
        with anyio.fail_after(30):
            kind, parent_id, old_child = (await proc.line()).split()
        assert kind == "P"
        proc.process.send_signal(signal.SIGKILL)
        proc.killed = True

    async def child(request: Request, ctx: RunContext) -> str:
        return f"child did {request.input}"

    async def parent(request: Request, ctx: RunContext) -> str:
        handle = ctx.spawn("child", "work", idempotency_key="ck")
        envelope = await handle.wait()
        left = ctx.mailbox.drain_all()
        return f"{handle.task_id}|{envelope.agent_path}|{envelope.output}|{len(left)}"

    agents = [
        AgentSpec(name="parent", runner=parent, resume="rerun"),
        AgentSpec(name="child", runner=child),
    ]
    async with SubagentManager(agents, config=SubagentConfig(store_path=path)) as m:
        with anyio.fail_after(30):
            envelope = await m.wait_result(parent_id)
        assert envelope is not None
        new_child, child_path, output, left = envelope.output.split("|")
        assert new_child != old_child  # the key was released: the work ran again
        assert output == "child did work"
        assert child_path == "/root/parent/child-2"  # the first try's name stays given
        assert left == "0"  # nothing stale left in its mailbox
        old = await m.wait_result(old_child, timeout=0)  # the old child still answers
        assert old is not None
        assert old.error_type == INTERRUPTED


async def test_a_rerun_claimed_by_a_cancelled_entry_is_run_by_the_next_manager(
    tmp_path: Path,
) -> None:
    path = tmp_path / "c.db"
    task_id = await _killed_while_running(path, "spawn", "asyncio")
    finisher = Finisher()
    spec = AgentSpec(name="stuck", runner=finisher, resume="rerun")
    async with SqliteStore(path, busy_timeout=0.05) as store:
        with write_locked(path):  # the recovery cannot commit: the entry waits for it
            with anyio.move_on_after(0.2) as scope:
                async with SubagentManager([spec], store=store):
                    raise AssertionError("entered without its recovery")  # pragma: no cover
            assert scope.cancelled_caught
        await store.wait_committed()  # the recovery (and its claim) commits anyway
        async with SubagentManager([spec], store=store) as m:
            with anyio.fail_after(30):
                envelope = await m.wait_result(task_id)
    assert envelope is not None
    assert envelope.status is Status.COMPLETED
    assert finisher.runs == [(task_id, "the input")]
    assert _row(path, task_id) == ("ended", 2, 1)


async def test_a_cancelled_entrys_claim_waits_for_a_manager_running_its_agent(
    tmp_path: Path,
) -> None:
    """A claim left by a cancelled entry goes to no manager that does not run its agent
    again; the store's close lets it go, and the next recovery (another store object, as
    another process would) runs it."""
    path = tmp_path / "o.db"
    task_id = await _killed_while_running(path, "spawn", "asyncio")
    finisher = Finisher()
    spec = AgentSpec(name="stuck", runner=finisher, resume="rerun")
    other = AgentSpec(name="other", runner=finisher)
    async with SqliteStore(path, busy_timeout=0.05) as store:
        with write_locked(path), anyio.move_on_after(0.2):
            async with SubagentManager([spec], store=store):
                raise AssertionError("entered without its recovery")  # pragma: no cover
        await store.wait_committed()
        async with SubagentManager([other], store=store) as m:  # not its agent: left alone
            assert m.tasks() == []
    assert _row(path, task_id)[0] == "queued"
    async with SubagentManager([spec], config=SubagentConfig(store_path=path)) as m:
        with anyio.fail_after(30):
            envelope = await m.wait_result(task_id)
    assert envelope is not None
    assert envelope.status is Status.COMPLETED
    assert finisher.runs == [(task_id, "the input")]


@pytest.mark.parametrize(
    ("column", "value"), [("request", b"not json"), ("agent_path", "not a path")]
)
async def test_a_damaged_row_ends_interrupted_instead_of_failing_recovery(
    tmp_path: Path, column: str, value: object
) -> None:
    path = tmp_path / "d.db"
    task_id = await _killed_while_running(path, "spawn", "asyncio")
    with sqlite(path) as conn:
        conn.execute(f"UPDATE tasks SET {column} = ? WHERE task_id = ?", (value, task_id))
    finisher = Finisher()
    spec = AgentSpec(name="stuck", runner=finisher, resume="rerun")
    async with SubagentManager([spec], config=SubagentConfig(store_path=path)) as m:
        envelope = await m.wait_result(task_id, timeout=0)
        assert (await m.spawn("stuck", "new").wait()).output == "done at last: new"
    assert envelope is not None
    assert envelope.error_type == INTERRUPTED
    assert finisher.runs == [(finisher.runs[0][0], "new")]


async def test_without_rerun_a_killed_spawn_ends_interrupted(
    tmp_path: Path, anyio_backend: str
) -> None:
    path = tmp_path / "i.db"
    task_id = await _killed_while_running(path, "spawn", anyio_backend)
    finisher = Finisher()
    spec = AgentSpec(name="stuck", runner=finisher)  # resume="interrupt", the default
    async with SubagentManager([spec], config=SubagentConfig(store_path=path)) as m:
        envelope = await m.wait_result(task_id, timeout=0)
    assert finisher.runs == []
    assert envelope is not None
    assert envelope.error_type == INTERRUPTED
    assert "times" not in envelope.error
    assert _row(path, task_id) == ("ended", 1, 1)


async def test_an_agent_no_longer_registered_is_not_rerun(tmp_path: Path) -> None:
    path = tmp_path / "u.db"
    task_id = await _killed_while_running(path, "spawn", "asyncio")
    async with SubagentManager([], config=SubagentConfig(store_path=path)) as m:
        envelope = await m.wait_result(task_id, timeout=0)
    assert envelope is not None
    assert envelope.error_type == INTERRUPTED
    assert _row(path, task_id) == ("ended", 1, 1)


def test_resume_and_max_attempts_are_checked() -> None:
    async def runner(request: Request, ctx: RunContext) -> str:
        return ""

    with pytest.raises(ValueError, match="resume must be 'interrupt' or 'rerun'"):
        AgentSpec(name="a", runner=runner, resume="again")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_attempts must be an integer >= 1"):
        AgentSpec(name="a", runner=runner, resume="rerun", max_attempts=0)
    with pytest.raises(ValueError, match="durability must be 'sync' or 'async'"):
        SubagentConfig(durability="later")  # type: ignore[arg-type]
