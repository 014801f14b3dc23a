"""Fuzzed arguments to the core API: every call either works (and the spawn then ends in
one envelope) or raises a clear ``SubagentsError`` and leaves nothing behind."""

from __future__ import annotations

import contextlib
import math

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from subagents import DelegateResult, Request, RunContext, Status, SubagentsError
from tests.helpers import clock_backends

from .support import make_manager, recorded

pytestmark = pytest.mark.anyio

ANY_SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=80),
    st.binary(max_size=20),
)
ARGS = st.fixed_dictionaries(
    {
        "agent": st.one_of(st.just("echo"), ANY_SCALAR),
        "input": st.one_of(st.text(max_size=200), ANY_SCALAR, st.lists(st.text(), max_size=3)),
        "session_id": st.one_of(st.sampled_from(["root", "s", "t"]), ANY_SCALAR),
        "name": st.one_of(st.none(), st.from_regex(r"[a-z][a-z0-9_.-]{0,10}", fullmatch=True)),
        "timeout": st.one_of(st.just(5.0), ANY_SCALAR),
    }
).map(lambda d: d | {"name": d["name"] if d["name"] != "" else None})
SETTINGS = settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


async def _echo(request: Request, ctx: RunContext) -> str:
    return request.input


@SETTINGS
@given(args=ARGS)
async def test_fuzzed_spawn_arguments(args: dict[str, object]) -> None:
    async with make_manager({"echo": _echo}) as manager:
        with recorded(manager) as events:
            before = manager.statistics()
            try:
                handle = manager.spawn(**args)  # type: ignore[arg-type]
            except SubagentsError:
                assert manager.statistics() == before
                assert not events
                return
            with anyio.fail_after(10):
                env = await handle.wait()
    assert isinstance(env, DelegateResult)
    timeout = args["timeout"]
    # A valid timeout far below a scheduler pass (hypothesis draws 1e-34) may fire first.
    tiny = isinstance(timeout, float) and timeout < 1.0
    assert env.status is Status.COMPLETED or (tiny and env.status is Status.TIMEOUT), env
    env.to_json()
    # What was accepted had the documented types.
    assert isinstance(args["session_id"], str), args
    assert isinstance(args["input"], str), args
    timeout = args["timeout"]
    assert timeout is None or (
        isinstance(timeout, (int, float))
        and not isinstance(timeout, bool)
        and not math.isnan(timeout)
        and timeout > 0
    ), args


@pytest.mark.parametrize("anyio_backend", clock_backends())
@SETTINGS
@given(task_id=ANY_SCALAR, timeout=ANY_SCALAR, session_id=st.one_of(st.none(), ANY_SCALAR))
async def test_fuzzed_wait_and_cancel_arguments(
    task_id: object, timeout: object, session_id: object
) -> None:
    """Each call raises a SubagentsError at once, returns, or (for a valid long timeout on
    an id nobody will deliver) is still blocked after 20 ms; nothing else, nothing left."""
    async with make_manager({"echo": _echo}) as manager:
        mailbox = manager.mailbox()
        for call in (
            lambda: manager.wait_result(task_id, timeout=timeout, session_id=session_id),  # type: ignore[arg-type]
            lambda: mailbox.wait(task_id, timeout=timeout),  # type: ignore[arg-type]
        ):
            with anyio.move_on_after(0.02), contextlib.suppress(SubagentsError):
                await call()
        with pytest.raises(SubagentsError):
            manager.cancel(task_id)  # type: ignore[arg-type]
        assert mailbox.statistics().task_subscribers == 0
