"""The "not given" default of ``timeout`` arguments: a sentinel of its own, distinct from
``None`` (no limit) and from every number, that reads well in signatures."""

from __future__ import annotations

import copy
import inspect
import pickle

import anyio
import pytest

from subagents import (
    AgentSpec,
    ConfigError,
    Request,
    RunContext,
    SpawnOptions,
    SubagentConfig,
    SubagentManager,
)
from subagents._spec import UNSET


async def _wait_long(request: Request, ctx: RunContext) -> str:
    # Reports the watchdog deadline it was given (None: no watchdog).
    return "none" if ctx.deadline is None else f"{ctx.deadline - anyio.current_time():.0f}"


def _manager(**config: object) -> SubagentManager:
    spec = AgentSpec(name="general", description="d", runner=_wait_long)
    return SubagentManager([spec], config=SubagentConfig(**config))  # type: ignore[arg-type]


def test_the_sentinel_reads_as_unset_in_signatures() -> None:
    assert repr(UNSET) == "UNSET"
    for function in (
        SubagentManager.spawn,
        SubagentManager.execute,
        RunContext.spawn,
        RunContext.execute,
    ):
        parameter = inspect.signature(function).parameters["timeout"]
        assert parameter.default is UNSET
        assert "timeout: 'float | _Unset | None' = UNSET" in str(inspect.signature(function))


def test_the_sentinel_is_one_object_and_not_a_number() -> None:
    assert copy.copy(UNSET) is UNSET
    assert copy.deepcopy(UNSET) is UNSET
    assert pickle.loads(pickle.dumps(UNSET)) is UNSET
    assert UNSET is not None
    assert not isinstance(UNSET, (int, float))


@pytest.mark.anyio
async def test_an_omitted_timeout_takes_the_configured_one() -> None:
    async with _manager(spawn_timeout=60.0, execute_timeout=30.0) as manager:
        assert (await manager.spawn("general").wait()).output == "60"
        assert (await manager.spawn("general", timeout=UNSET).wait()).output == "60"
        assert (await manager.execute("general")).output == "30"
        options = SpawnOptions(timeout=10.0)
        assert (await manager.spawn("general", options=options).wait()).output == "10"
        # None is a value, not "not given": no watchdog at all.
        assert (await manager.spawn("general", timeout=None).wait()).output == "none"


@pytest.mark.anyio
async def test_a_nan_timeout_is_malformed_not_unset() -> None:
    async with _manager() as manager:
        with pytest.raises(ConfigError, match="timeout"):
            manager.spawn("general", timeout=float("nan"))
        with pytest.raises(ConfigError, match="timeout"):
            await manager.execute("general", timeout=float("nan"))


@pytest.mark.anyio
async def test_a_timeout_given_twice_is_refused_but_unset_is_not_given() -> None:
    async with _manager() as manager:
        options = SpawnOptions(timeout=10.0)
        with pytest.raises(ConfigError, match="given once"):
            manager.spawn("general", timeout=5.0, options=options)
        assert (await manager.spawn("general", timeout=UNSET, options=options).wait()).ok
