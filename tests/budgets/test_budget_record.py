"""The Budget record and where budgets and fan-out limits are given: each field checked
with a message naming it, narrowing by intersection, and a setting given twice refused."""

from __future__ import annotations

import pytest

from subagents import AgentSpec, Budget, ConfigError, SpawnOptions, SubagentConfig
from subagents._ledger import with_budget
from tests.helpers import echo


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tokens", -1),
        ("input_tokens", 1.5),
        ("output_tokens", "10"),
        ("spawns", True),
        ("seconds", -1.0),
        ("seconds", float("nan")),
        ("seconds", float("inf")),
        ("tokens", 2**63),
    ],
)
def test_a_bad_field_is_refused_naming_it(field: str, value: object) -> None:
    with pytest.raises(ConfigError) as caught:
        Budget(**{field: value})  # type: ignore[arg-type]
    assert caught.value.field == f"budget.{field}"
    assert f"budget.{field}" in str(caught.value)


def test_zero_is_a_budget_that_is_used_up() -> None:
    budget = Budget(tokens=0, seconds=0, spawns=0)
    assert budget.to_dict() == {"tokens": 0, "seconds": 0.0, "spawns": 0}
    assert not budget.unlimited


def test_negative_zero_seconds_is_zero() -> None:
    budget = Budget(seconds=-0.0)
    assert budget.seconds == 0.0
    assert str(budget.seconds) == "0.0"
    assert f"{budget.seconds:g}" == "0"


def test_a_subclassed_count_is_kept_as_a_plain_int() -> None:
    class Sly(int):
        def __format__(self, spec: str) -> str:
            raise RuntimeError("never formatted")

    budget = Budget(tokens=Sly(5))
    assert type(budget.tokens) is int


def test_intersect_keeps_the_tighter_limit_of_each_field() -> None:
    a = Budget(tokens=100, seconds=5.0)
    b = Budget(tokens=50, spawns=3)
    assert a.intersect(b) == Budget(tokens=50, seconds=5.0, spawns=3)
    assert a.intersect(None) is a
    assert Budget().unlimited
    assert Budget().intersect(Budget()) == Budget()


def test_to_dict_and_from_dict_round_trip_and_refuse_unknown_keys() -> None:
    budget = Budget(tokens=10, input_tokens=4, output_tokens=6, seconds=1.5, spawns=2)
    assert Budget.from_dict(budget.to_dict()) == budget
    assert Budget.from_dict({"tokens": None}) == Budget()
    with pytest.raises(ConfigError, match="budget"):
        Budget.from_dict({"token": 5})


def test_the_records_that_carry_a_budget_check_its_type() -> None:
    with pytest.raises(ConfigError, match="budget must be a Budget or None"):
        SpawnOptions(budget={"tokens": 5})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="budget must be a Budget or None"):
        AgentSpec(name="a", runner=echo, budget=5)  # type: ignore[arg-type]
    assert SpawnOptions(budget=Budget(tokens=1)).budget == Budget(tokens=1)


@pytest.mark.parametrize("field", ["max_children", "max_agents"])
def test_fan_out_limits_are_counts_or_none(field: str) -> None:
    assert getattr(SubagentConfig(), field) is None
    assert getattr(SubagentConfig(**{field: 3}), field) == 3
    with pytest.raises(ConfigError) as caught:
        SubagentConfig(**{field: -1})
    assert caught.value.field == field


def test_a_budget_given_as_argument_and_in_options_is_refused() -> None:
    options = SpawnOptions(budget=Budget(tokens=1))
    with pytest.raises(ConfigError, match="given once"):
        with_budget(options, Budget(tokens=2))
    assert with_budget(None, Budget(tokens=2)) == SpawnOptions(budget=Budget(tokens=2))
    assert with_budget(options, None) is options
    with pytest.raises(ConfigError, match="budget must be a Budget or None"):
        with_budget(None, {"tokens": 2})  # type: ignore[arg-type]
