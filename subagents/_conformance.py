"""What the conformance suites share: a named check, the error that reports broken
promises, and the runner that bounds each check in time.

A check is an async callable that raises :class:`AssertionError` naming the promise it
tests. The suites build their checks from public interfaces only, so a durable mailbox or a
remote backend runs exactly the checks the in-memory ones pass.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence

import anyio
import attrs

__all__ = ["Check", "ConformanceError", "require", "run_checks", "select"]


class ConformanceError(AssertionError):
    """Some checks of a conformance suite failed; :attr:`failures` says which and why."""

    def __init__(self, suite: str, failures: dict[str, AssertionError]) -> None:
        self.suite = suite
        self.failures = failures
        """Check name → the assertion that check raised, in the order the checks ran."""
        lines = "\n".join(f"  - {error}" for error in failures.values())
        super().__init__(f"{len(failures)} {suite} check(s) failed:\n{lines}")


def require(condition: object, message: str) -> None:
    """Fail the current check with ``message`` unless ``condition`` holds.

    Not ``assert``: the suites ship in the library, and ``python -O`` strips asserts.
    """
    if not condition:
        raise AssertionError(message)


@attrs.frozen(kw_only=True)
class Check:
    """One promise of an interface and the code that tests it.

    ``await check()`` runs it in the caller's anyio event loop (asyncio or trio). It raises
    :class:`AssertionError` whose message starts with ``name``; an unexpected exception from
    the implementation, or a check that does not finish within ``deadline`` seconds (a
    waiter never woken, a child never ended), is reported the same way. Cancellation of the
    caller propagates unchanged.
    """

    name: str
    """A short identifier, usable as a pytest parameter id (``overwrite_without_growth``)."""
    promise: str
    """The promise in one sentence."""
    body: Callable[[], Awaitable[None]] = attrs.field(repr=False)
    """The test itself."""
    deadline: float = 30.0
    """Seconds the check may take before it counts as hung."""

    async def __call__(self) -> None:
        try:
            with anyio.fail_after(self.deadline):
                await self.body()
        except TimeoutError as exc:
            raise AssertionError(
                f"{self.name}: {self.promise} (the check did not finish within "
                f"{self.deadline:g} s: something that should end never did)"
            ) from exc
        except Exception as exc:
            inner = _single(exc)
            if isinstance(inner, AssertionError):
                raise AssertionError(f"{self.name}: {self.promise} ({inner})") from exc
            raise AssertionError(
                f"{self.name}: {self.promise} (raised {type(inner).__qualname__}: {inner})"
            ) from exc


def _single(exc: BaseException) -> BaseException:
    """The exception inside a task group's single-member groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def select(checks: Sequence[Check], skip: Iterable[str]) -> list[Check]:
    """``checks`` without those named in ``skip``; an unknown name raises ``ValueError``
    (a misspelt skip would otherwise silently run the check, or hide a typo forever)."""
    names = {check.name for check in checks}
    skipped = set(skip)
    unknown = skipped - names
    if unknown:
        raise ValueError(f"unknown check name(s) {sorted(unknown)}; known: {sorted(names)}")
    return [check for check in checks if check.name not in skipped]


async def run_checks(suite: str, checks: Iterable[Check]) -> None:
    """Run every check in turn; raise :class:`ConformanceError` listing all that failed."""
    failures: dict[str, AssertionError] = {}
    for check in checks:
        try:
            await check()
        except AssertionError as error:
            failures[check.name] = error
    if failures:
        raise ConformanceError(suite, failures)
