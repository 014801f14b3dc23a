"""Nested delegation, execute, the runner contract, RunContext and agent lookup."""

from __future__ import annotations

import anyio
import orjson
import pytest

from subagents import (
    AgentSpec,
    DelegateResult,
    Request,
    Result,
    RunContext,
    SpawnHandle,
    SpawnOptions,
    SpawnRejected,
    Status,
    SubagentManager,
    UnknownAgent,
    Usage,
)
from tests.helpers import Tracker, clock_backends, echo, manager_with, session_state, spec

# ---------------------------------------------------------------- nested delegation


@pytest.mark.anyio
async def test_nested_spawn_and_execute_paths_and_sessions() -> None:
    info: dict[str, object] = {}

    async def leaf(request: Request, ctx: RunContext) -> str:
        info[request.input] = (str(ctx.agent_path), str(ctx.parent_path), ctx.parent_session_id)
        return f"leaf {request.input}"

    async def middle(request: Request, ctx: RunContext) -> str:
        assert ctx.session_id == ctx.task_id
        spawned = ctx.spawn("leaf", "spawned")
        assert spawned.session_id == ctx.task_id
        executed = await ctx.execute("leaf", "executed")
        got = await ctx.wait(spawned.task_id, timeout=5)
        assert got is not None
        assert ctx.mailbox.peek(spawned.task_id) is None  # ctx.wait consumed it
        info["middle"] = ctx.task_id
        return f"{got.output} + {executed.output} ({got.agent_path}, {executed.agent_path})"

    async with manager_with(spec("a", middle), spec("b", leaf)) as manager:
        manager.register(spec("leaf", leaf))
        env = await manager.spawn("a").wait()
    assert env.status is Status.COMPLETED, env.error
    assert env.agent_path == "/root/a"
    assert env.parent_path == "/root"
    assert env.output == "leaf spawned + leaf executed (/root/a/leaf, /root/a/leaf-2)"
    middle_id = info["middle"]
    assert info["spawned"] == ("/root/a/leaf", "/root/a", middle_id)
    assert info["executed"] == ("/root/a/leaf-2", "/root/a", middle_id)


@pytest.mark.anyio
async def test_three_levels_give_root_a_b() -> None:
    async def b(request: Request, ctx: RunContext) -> str:
        return str(ctx.agent_path)

    async def a(request: Request, ctx: RunContext) -> str:
        return (await ctx.execute("b")).output

    async with manager_with(spec("a", a), spec("b", b)) as manager:
        assert (await manager.spawn("a").wait()).output == "/root/a/b"


@pytest.mark.anyio
async def test_children_of_an_ended_child_are_cancelled_into_envelopes() -> None:
    tracker = Tracker()
    grandchildren: list[SpawnHandle] = []

    async def parent(request: Request, ctx: RunContext) -> str:
        grandchildren.append(ctx.spawn("g", "running"))
        grandchildren.append(ctx.spawn("g", "running-2"))
        await tracker.entered.wait()
        return "parent done"  # returns without waiting for them

    async with manager_with(spec("p", parent), spec("g", tracker.runner)) as manager:
        env = await manager.spawn("p").wait()
        assert env.status is Status.COMPLETED
        # by the time the parent's envelope exists, its children have settled
        assert all(g.done.is_set() for g in grandchildren)
        for g in grandchildren:
            assert g.result is not None
            assert g.result.status is Status.CANCELLED
            assert "parent" in g.result.error
            assert manager.result(g.task_id) == g.result
        assert tracker.alive == 0
        # the ended child's session is closed: nothing can be spawned into it
        assert manager.session_closed(env.task_id)


@pytest.mark.anyio
async def test_queued_grandchildren_of_an_ended_child_are_cancelled() -> None:
    tracker = Tracker()
    grandchildren: list[SpawnHandle] = []

    async def parent(request: Request, ctx: RunContext) -> str:
        for i in range(3):
            grandchildren.append(ctx.spawn("g", str(i)))
        await tracker.entered.wait()
        raise RuntimeError("parent failed")

    async with manager_with(
        spec("p", parent), spec("g", tracker.runner), max_concurrent_spawns=2
    ) as manager:
        env = await manager.spawn("p").wait()
    assert env.status is Status.ERROR
    assert [g.result.status for g in grandchildren] == [Status.CANCELLED] * 3  # type: ignore[union-attr]
    assert tracker.started == ["0"]  # the queued ones never ran
    assert tracker.alive == 0


@pytest.mark.anyio
async def test_max_depth_rejects_with_actionable_message() -> None:
    errors: list[SpawnRejected] = []
    depths: list[int] = []

    async def recurse(request: Request, ctx: RunContext) -> str:
        depths.append(ctx.agent_path.depth)
        try:
            return (await ctx.execute("r")).output
        except SpawnRejected as exc:
            errors.append(exc)
            return "stopped"

    async with manager_with(spec("r", recurse)) as manager:  # default max_depth=3
        env = await manager.spawn("r").wait()
    assert env.output == "stopped"
    assert depths == [1, 2, 3]
    (error,) = errors
    assert error.reason == "depth"
    message = str(error)
    assert "max_depth is 3" in message
    assert "yourself" not in message  # for the programmer; the tools speak to the model


@pytest.mark.anyio
async def test_max_depth_one_lets_only_the_root_delegate() -> None:
    errors: list[Exception] = []

    async def child(request: Request, ctx: RunContext) -> str:
        try:
            ctx.spawn("c")
        except SpawnRejected as exc:
            errors.append(exc)
        return "ok"

    async with manager_with(spec("c", child), max_depth=1) as manager:
        assert (await manager.spawn("c").wait()).output == "ok"
    assert len(errors) == 1


@pytest.mark.anyio
async def test_max_depth_zero_rejects_top_level_spawn() -> None:
    async with manager_with(spec("echo", echo), max_depth=0) as m:
        with pytest.raises(SpawnRejected, match="max_depth is 0") as raised:
            m.spawn("echo", "x")
        assert raised.value.reason == "depth"


@pytest.mark.anyio
async def test_close_session_cancels_the_whole_subtree() -> None:
    grandchildren: list[SpawnHandle] = []

    async def mid(request: Request, ctx: RunContext) -> str:
        grandchildren.append(ctx.spawn("f", "a"))
        await anyio.sleep_forever()
        return ""

    async def forever(request: Request, ctx: RunContext) -> str:
        await anyio.sleep_forever()
        return ""

    async with manager_with(spec("mid", mid), spec("f", forever)) as m:
        parent = m.spawn("mid", "x", session_id="s")
        await anyio.wait_all_tasks_blocked()
        with anyio.fail_after(5):
            await m.close_session("s")
        assert parent.result is not None
        assert parent.result.status == Status.CANCELLED
        (g,) = grandchildren
        assert g.done.is_set()
        assert g.result is not None
        assert g.result.status == Status.CANCELLED
        assert m.statistics().running == 0


@pytest.mark.anyio
async def test_closing_a_child_session_rejects_its_later_spawns() -> None:
    tracker = Tracker()
    ready = anyio.Event()
    closed = anyio.Event()
    outcome: list[object] = []

    async def parent(request: Request, ctx: RunContext) -> str:
        ctx.spawn("g")
        ready.set()
        await closed.wait()
        try:
            ctx.spawn("g")
        except SpawnRejected as exc:
            outcome.append(exc.reason)
        else:
            outcome.append("accepted")
        return "done"

    async with manager_with(spec("p", parent), spec("g", tracker.runner)) as manager:
        handle = manager.spawn("p")
        await ready.wait()
        await manager.close_session(handle.task_id)
        closed.set()
        await handle.wait()
    assert outcome == ["session_closed"]


# ---------------------------------------------------------------- execute


@pytest.mark.anyio
async def test_execute_returns_envelope_without_taking_a_slot() -> None:
    tracker = Tracker()
    async with manager_with(
        spec("block", tracker.runner), spec("e", echo), max_concurrent_spawns=1
    ) as manager:
        blocker = manager.spawn("block")
        await tracker.entered.wait()
        with anyio.fail_after(5):  # would hang if execute waited for the only slot
            env = await manager.execute("e", "hello")
        assert isinstance(env, DelegateResult)
        assert env.status is Status.COMPLETED
        assert env.output == "hello"
        assert env.queue_ms == 0
        assert manager.statistics().running == 1
        assert blocker.state == "running"
        tracker.open()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_execute_timeout_and_errors_are_in_the_envelope() -> None:
    async def boom(request: Request, ctx: RunContext) -> str:
        raise KeyError("k")

    async def slow(request: Request, ctx: RunContext) -> str:
        ctx.report(output="half")
        await anyio.sleep_forever()
        return ""

    async with manager_with(spec("boom", boom), spec("slow", slow)) as manager:
        err = await manager.execute("boom")
        late = await manager.execute("slow", timeout=0.05)
    assert err.status is Status.ERROR
    assert err.error_type == "KeyError"
    assert late.status is Status.TIMEOUT
    assert late.output == "half"


@pytest.mark.anyio
async def test_cancelled_execute_caller_still_records_an_envelope() -> None:
    tracker = Tracker()
    completed: list[str] = []
    async with manager_with(spec("w", tracker.runner)) as manager:
        manager.events.subscribe(
            lambda e: completed.append(e.data["status"]) if e.type == "subagent.completed" else None  # type: ignore[arg-type]
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(manager.execute, "w")
            await tracker.entered.wait()
            tg.cancel_scope.cancel()  # the caller of execute is cancelled
        (handle,) = manager.tasks()
        assert handle.result is not None
        assert handle.result.status is Status.CANCELLED
    assert completed == ["cancelled"]
    assert tracker.alive == 0


# ---------------------------------------------------------------- lookup and contract


@pytest.mark.anyio
async def test_unknown_agent_names_the_registered_ones() -> None:
    async with manager_with(spec("beta", echo), spec("alpha", echo)) as manager:
        with pytest.raises(UnknownAgent) as info:
            manager.spawn("gamma")
        assert isinstance(info.value, LookupError)
        assert "gamma" in str(info.value)
        assert "alpha, beta" in str(info.value)
        assert info.value.known == ("alpha", "beta")
        with pytest.raises(UnknownAgent):
            await manager.execute("gamma")
        assert manager.statistics().spawned == 0


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("value", "type_name"),
    [(42, "int"), (None, "NoneType"), (b"bytes", "bytes"), ({"output": "x"}, "dict")],
)
async def test_wrong_return_type_is_an_error_naming_the_type(value: object, type_name: str) -> None:
    async def runner(request: Request, ctx: RunContext) -> object:
        return value

    async with manager_with(spec("w", runner)) as manager:
        env = await manager.spawn("w").wait()
    assert env.status is Status.ERROR
    assert type_name in env.error
    assert "Result or str" in env.error


@pytest.mark.anyio
async def test_str_is_wrapped_and_result_is_kept() -> None:
    async def plain(request: Request, ctx: RunContext) -> str:
        return "plain text"

    async def rich(request: Request, ctx: RunContext) -> Result:
        return Result(
            output="rich",
            usage=Usage(input_tokens=1, output_tokens=2),
            iterations=3,
            files_changed=("x.py",),
        )

    async def reported_error(request: Request, ctx: RunContext) -> Result:
        return Result(output="partial", error="could not finish")

    async with manager_with(
        spec("plain", plain), spec("rich", rich), spec("bad", reported_error)
    ) as manager:
        a = await manager.spawn("plain").wait()
        b = await manager.spawn("rich").wait()
        c = await manager.spawn("bad").wait()
    assert (a.status, a.output) == (Status.COMPLETED, "plain text")
    assert (b.status, b.output, b.iterations) == (Status.COMPLETED, "rich", 3)
    assert b.usage == Usage(input_tokens=1, output_tokens=2)
    assert b.files_changed == ("x.py",)
    assert c.status is Status.ERROR
    assert "could not finish" in c.error


@pytest.mark.anyio
async def test_request_carries_the_effective_prompt_and_model() -> None:
    """One generic runner serves several agent types: it reads both from the request."""

    async def probe(request: Request, ctx: RunContext) -> str:
        return f"{request.prompt}|{request.model}|{','.join(request.files)}"

    async with SubagentManager(
        [spec("p", probe, prompt="spec prompt", model="spec-model"), spec("bare", probe)]
    ) as m:
        assert (await m.spawn("p", "x").wait()).output == "spec prompt|spec-model|"
        options = SpawnOptions(prompt="P", model="M", files=["a.py"])
        assert (await m.spawn("p", "x", options=options).wait()).output == "P|M|a.py"
        assert (await m.execute("bare", "x")).output == "None|None|"


@pytest.mark.anyio
async def test_run_context_exposes_identity_and_deadline() -> None:
    seen: dict[str, object] = {}

    async def runner(request: Request, ctx: RunContext) -> str:
        seen.update(
            task_id=ctx.task_id,
            session_id=ctx.session_id,
            parent_session_id=ctx.parent_session_id,
            agent=ctx.agent,
            agent_path=ctx.agent_path,
            parent_path=ctx.parent_path,
            attempt=ctx.attempt,
            deadline=ctx.deadline,
            remaining=ctx.remaining(),
            now=anyio.current_time(),
            input=request.input,
            request_agent=request.agent,
        )
        return ""

    async with manager_with(spec("w", runner)) as manager:
        h = manager.spawn("w", "in", session_id="sess", timeout=30)
        await h.wait()
        assert seen["task_id"] == h.task_id
        assert seen["session_id"] == h.task_id
        assert seen["parent_session_id"] == "sess"
        assert seen["agent"] == "w"
        assert seen["agent_path"] == "/root/w"
        assert seen["parent_path"] == "/root"
        assert seen["attempt"] == 1
        assert seen["input"] == "in"
        assert seen["request_agent"] == "w"
        deadline = seen["deadline"]
        assert isinstance(deadline, float)
        assert 29 < deadline - seen["now"] <= 30  # type: ignore[operator]
        assert 29 < seen["remaining"] <= 30  # type: ignore[operator]
        await manager.spawn("w", timeout=None).wait()
        assert seen["deadline"] is None
        assert seen["remaining"] is None


@pytest.mark.anyio
async def test_result_status_given_as_text_is_accepted_or_an_error() -> None:
    async def as_text(request: Request, ctx: RunContext) -> Result:
        return Result(output="fine", status=request.input)  # type: ignore[arg-type]

    async with manager_with(spec("w", as_text)) as manager:
        with anyio.fail_after(5):
            ok = await manager.spawn("w", "completed").wait()
            bogus = await manager.spawn("w", "bogus").wait()
            # the manager survived both
            again = await manager.spawn("w", "completed").wait()
    assert (ok.status, ok.output) == (Status.COMPLETED, "fine")
    assert bogus.status is Status.ERROR
    assert "bogus" in bogus.error
    assert again.status is Status.COMPLETED


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", clock_backends())
async def test_undecodable_text_never_breaks_the_envelope_json() -> None:
    async def raises(request: Request, ctx: RunContext) -> str:
        raise ValueError("bad byte \udcff")

    async def returns(request: Request, ctx: RunContext) -> Result:
        return Result(output="x\udcff", error="bad \udcff", files_changed=("f\udcff",))

    async def reports(request: Request, ctx: RunContext) -> str:
        ctx.report(output="partial \udcff")
        await anyio.sleep_forever()
        return ""

    async with manager_with(
        spec("raises", raises), spec("returns", returns), spec("reports", reports)
    ) as manager:
        envs = [
            await manager.spawn(name, timeout=0.05).wait()
            for name in ("raises", "returns", "reports")
        ]
    for env in envs:
        data = env.to_json()  # never raises
        assert DelegateResult.from_dict(orjson.loads(data)) == env
    assert "bad byte" in envs[0].error
    assert envs[1].files_changed[0].startswith("f")
    assert envs[2].output.startswith("partial ")


@pytest.mark.anyio
async def test_cancel_after_the_runner_returned_keeps_its_result() -> None:
    """While a finished child waits for its own children to settle, a late cancel must not
    throw its result away."""
    settling = anyio.Event()
    cancelled_meanwhile = anyio.Event()

    async def slow_to_settle(request: Request, ctx: RunContext) -> str:
        try:
            await anyio.sleep_forever()
        finally:
            settling.set()
            with anyio.CancelScope(shield=True):
                await cancelled_meanwhile.wait()  # still settling when the cancel comes
        return ""

    async def parent(request: Request, ctx: RunContext) -> str:
        ctx.spawn("g")
        await anyio.wait_all_tasks_blocked()
        return "the parent's result"

    async with manager_with(spec("p", parent), spec("g", slow_to_settle)) as manager:
        handle = manager.spawn("p")
        await settling.wait()  # the parent's runner has returned; its child is settling
        handle.cancel()
        cancelled_meanwhile.set()
        env = await handle.wait()
    assert env.status is Status.COMPLETED
    assert env.output == "the parent's result"


@pytest.mark.anyio
async def test_a_plain_text_result_keeps_what_the_runner_reported() -> None:
    """A runner returning a str ends like Result(output=...): the text (cleaned, a str
    subclass made a str) with the usage, iterations and paths it reported on the way."""
    from subagents import Usage

    class Text(str):
        pass

    async def texty(request: Request, ctx: RunContext) -> str:
        ctx.report(usage=Usage(input_tokens=2, output_tokens=3), iterations=4)
        ctx.report(files_changed=["a.py"])
        return Text("done \udcff") if request.input == "sub" else "done"

    spec = AgentSpec(name="texty", description="d", runner=texty)
    async with SubagentManager([spec]) as manager:
        for text in ("plain", "sub"):
            handle = manager.spawn("texty", text)
            envelope = await handle.wait()
            assert envelope.status is Status.COMPLETED
            assert type(envelope.output) is str
            assert envelope.output == ("done" if text == "plain" else "done ?")
            assert envelope.usage == Usage(input_tokens=2, output_tokens=3)
            assert envelope.iterations == 4
            assert envelope.files_changed == ("a.py",)
            assert envelope.attempts == 1
            assert envelope.agent_path == handle.agent_path
            assert 0 <= envelope.queue_ms <= envelope.duration_ms


@pytest.mark.anyio
async def test_an_oversized_plain_text_is_still_bounded() -> None:
    """A plain text past the output bound is cut, with a marker saying how much."""
    from subagents._progress import MAX_OUTPUT_CHARS

    async def huge(request: Request, ctx: RunContext) -> str:
        return "x" * (MAX_OUTPUT_CHARS + 10)

    spec = AgentSpec(name="huge", description="d", runner=huge)
    async with SubagentManager([spec]) as manager:
        envelope = await manager.spawn("huge").wait()
    assert envelope.output.startswith("x" * MAX_OUTPUT_CHARS)
    assert envelope.output.endswith("[… 10 characters dropped …]")


@pytest.mark.anyio
async def test_a_child_session_is_released_when_it_ends() -> None:
    """A child that only opened its mailbox, or only delegated, has its session state
    (mailbox, names, live children) released as it ends; one that did neither has none."""
    mailboxes: list[object] = []

    async def opens_mailbox(request: Request, ctx: RunContext) -> str:
        mailboxes.append(ctx.mailbox)
        return "ok"

    async def delegates(request: Request, ctx: RunContext) -> str:
        await ctx.spawn("plain").wait()
        mailboxes.append(ctx.mailbox)
        return "ok"

    async def plain(request: Request, ctx: RunContext) -> str:
        return "ok"

    specs = [
        AgentSpec(name="opens", description="d", runner=opens_mailbox),
        AgentSpec(name="delegates", description="d", runner=delegates),
        AgentSpec(name="plain", description="d", runner=plain),
    ]
    async with SubagentManager(specs) as manager:
        for agent in ("opens", "delegates", "plain"):
            handle = manager.spawn(agent)
            await handle.done.wait()
            assert session_state(manager, handle.task_id) == []
        assert len(mailboxes) == 2
        assert all(mailbox.closed for mailbox in mailboxes)  # type: ignore[attr-defined]


@pytest.mark.anyio
async def test_a_child_cancelled_in_the_queue_releases_the_mailbox_of_its_session() -> None:
    """A queued child's session mailbox (a host watching it) is released when the child is
    cancelled before it ran, as for a child that ran: its waiters wake, and no mailbox stays
    behind for the manager's lifetime."""
    gate = anyio.Event()

    async def gated(request: Request, ctx: RunContext) -> str:
        await gate.wait()
        return request.input

    async with manager_with(spec("gated", gated), max_concurrent_spawns=1) as manager:
        with anyio.fail_after(5):
            running = manager.spawn("gated")
            queued = manager.spawn("gated")
            mailbox = manager.mailbox(queued.task_id)
            got: list[object] = []

            async def reader() -> None:
                got.append(await mailbox.wait("nothing-will-land"))

            async with anyio.create_task_group() as tg:
                tg.start_soon(reader)
                await anyio.wait_all_tasks_blocked()
                assert manager.cancel(queued.task_id)
            assert got == [None]  # woken by the drop, not left waiting until aclose
            assert mailbox.closed
            assert session_state(manager, queued.task_id) == []
            gate.set()
            await running.wait()
