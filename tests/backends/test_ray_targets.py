"""How runners travel to Ray's workers, without ray: by import path, a function pickled by
value once (and unpickled once per worker), any other callable as itself on every call."""

from __future__ import annotations

import gc
import pickle
import weakref

from subagents import Request
from subagents.backends._ray_targets import Targets
from subagents.backends._ray_wire import RemoteContext, Runner, resolve


async def module_level(request: Request, ctx: RemoteContext) -> str:
    return "by path"


class Greeter:
    def __init__(self, greeting: str) -> None:
        self.greeting = greeting

    async def __call__(self, request: Request, ctx: RemoteContext) -> str:
        return self.greeting


class CountingDumps:
    """A stand-in for cloudpickle: each call's argument, and bytes naming it."""

    def __init__(self) -> None:
        self.dumped: list[object] = []

    def __call__(self, value: object) -> bytes:
        self.dumped.append(value)
        return f"pickled {getattr(value, '__qualname__', value)!r}".encode()


def closure(greeting: str) -> Runner:
    async def greets(request: Request, ctx: RemoteContext) -> str:
        return greeting

    return greets


def test_a_module_level_function_travels_by_import_path_and_is_never_pickled() -> None:
    dumps = CountingDumps()
    targets = Targets(dumps)
    assert targets.target(module_level) == f"{__name__}:module_level"
    assert dumps.dumped == []


def test_a_function_without_an_import_path_is_pickled_once_for_all_its_calls() -> None:
    dumps = CountingDumps()
    targets = Targets(dumps)
    runner = closure("hi")
    first = targets.target(runner)
    assert isinstance(first, bytes)
    assert targets.target(runner) == first
    assert dumps.dumped == [runner]


def test_a_copy_by_value_claims_main_and_is_pickled_once() -> None:
    dumps = CountingDumps()
    targets = Targets(dumps)
    shipped = targets.copy(module_level)
    assert isinstance(shipped, bytes)
    assert targets.target(module_level) == shipped
    (copy,) = dumps.dumped
    assert copy is not module_level
    assert getattr(copy, "__module__", None) == "__main__"


def test_a_callable_object_travels_as_itself_on_every_call() -> None:
    dumps = CountingDumps()
    targets = Targets(dumps)
    runner = Greeter("hello")
    first = targets.target(runner)
    runner.greeting = "changed"  # each call pickles it again: the worker sees this
    again = targets.target(runner)
    assert first is runner
    assert again is runner
    assert dumps.dumped == []


def test_a_pickled_function_holds_nothing_it_closes_over_alive() -> None:
    targets = Targets(lambda value: b"the bytes only")
    runner = closure("hi")
    alive = weakref.ref(runner)
    assert targets.target(runner) == b"the bytes only"
    del runner
    gc.collect()
    assert alive() is None


Unpickled: list[str] = []


def rebuilt(name: str) -> object:
    Unpickled.append(name)
    return module_level


class Recipe:
    """Pickles to a call of :func:`rebuilt`, which records each unpickling."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return rebuilt, (self.name,)


def test_a_worker_unpickles_a_pickled_function_once() -> None:
    Unpickled.clear()
    blob = pickle.dumps(Recipe("one"))
    cache: dict[str | bytes, Runner] = {}
    assert resolve(blob, cache) is module_level
    assert resolve(bytes(blob), cache) is module_level
    assert Unpickled == ["one"]


def test_a_worker_keeps_a_bounded_number_of_runners_dropping_the_oldest() -> None:
    Unpickled.clear()
    cache: dict[str | bytes, Runner] = {}
    blobs = [pickle.dumps(Recipe(str(i))) for i in range(300)]
    for blob in blobs:
        resolve(blob, cache)
    assert len(cache) == 256
    assert blobs[0] not in cache
    assert blobs[-1] in cache
    resolve(blobs[0], cache)
    assert Unpickled.count("0") == 2
