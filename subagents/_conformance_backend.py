"""The backend conformance suite: every promise of a :data:`Backend`, as named checks.

Each check runs agents through ``SubagentManager(backend=...)``, the only way a backend
is used, and reads the envelopes they end in. The runners are module-level functions
that keep no state outside their ``Request`` and ``RunContext`` (a retried runner reads
``ctx.attempt``), so a backend that ships runners to another process can run them.
"""

from __future__ import annotations

from collections.abc import Iterable

import anyio

from ._backend import Backend
from ._conformance import Check, require, run_checks, select
from ._context import RunContext
from ._envelope import DelegateResult, Status, Usage
from ._errors import TransientError
from ._manager import SubagentManager
from ._retry import RetryPolicy
from ._spec import AgentSpec, Request, Result, SpawnOptions, SubagentConfig

__all__ = ["backend_checks", "check_backend"]


class ConformanceRunnerError(Exception):
    """Raised by a conformance runner: a user's exception type, not a builtin."""


async def _echo(request: Request, ctx: RunContext) -> str:
    return f"echo: {request.input}"


async def _echo_interleaved(request: Request, ctx: RunContext) -> str:
    for _ in range(3):  # lets concurrent runs overlap, as remote ones do
        await anyio.lowlevel.checkpoint()
    return f"echo: {request.input}"


async def _raise_interleaved(request: Request, ctx: RunContext) -> str:
    for _ in range(3):
        await anyio.lowlevel.checkpoint()
    raise ValueError(f"conformance failure: {request.input}")


async def _describe(request: Request, ctx: RunContext) -> str:
    return _description(request, ctx.task_id, ctx.agent)


def _description(request: Request, task_id: str, agent: str) -> str:
    return (
        f"agent={request.agent} input={request.input} prompt={request.prompt} "
        f"files={list(request.files)} model={request.model} task={task_id} ctx_agent={agent}"
    )


async def _full_result(request: Request, ctx: RunContext) -> Result:
    return Result(
        output="with every field",
        usage=Usage(input_tokens=11, output_tokens=22),
        iterations=3,
        files_changed=("a.py", "b/c.py"),
    )


async def _reports_status(request: Request, ctx: RunContext) -> Result:
    return Result(output="gave up", status=Status.TIMEOUT)


async def _reports_error(request: Request, ctx: RunContext) -> Result:
    return Result(output="partial", error="the runner reports a failure")


async def _raise_builtin(request: Request, ctx: RunContext) -> str:
    raise ValueError(f"conformance failure: {request.input}")


async def _raise_custom(request: Request, ctx: RunContext) -> str:
    raise ConformanceRunnerError(f"custom failure: {request.input}")


async def _hang(request: Request, ctx: RunContext) -> str:
    await anyio.sleep_forever()
    raise AssertionError("unreachable")  # pragma: no cover


async def _late(request: Request, ctx: RunContext) -> str:
    try:
        await anyio.sleep_forever()
    except anyio.get_cancelled_exc_class():
        # Swallowed on purpose: a result handed back after the watchdog must not count.
        return "a result after the watchdog"
    raise AssertionError("unreachable")  # pragma: no cover


async def _report_then_return(request: Request, ctx: RunContext) -> str:
    ctx.report(usage=Usage(input_tokens=7, output_tokens=8), iterations=4, files_changed=["r.txt"])
    return "done after reporting"


async def _report_then_hang(request: Request, ctx: RunContext) -> str:
    ctx.report(output="partial output", usage=Usage(input_tokens=1, output_tokens=2), iterations=1)
    await anyio.sleep_forever()
    raise AssertionError("unreachable")  # pragma: no cover


async def _flaky(request: Request, ctx: RunContext) -> str:
    if ctx.attempt < 3:
        raise TransientError(f"transient failure on attempt {ctx.attempt}")
    return f"succeeded on attempt {ctx.attempt}"


async def _always_transient(request: Request, ctx: RunContext) -> str:
    raise TransientError(f"transient failure on attempt {ctx.attempt}")


async def _not_transient(request: Request, ctx: RunContext) -> str:
    raise ValueError(f"permanent failure on attempt {ctx.attempt}")


async def _returns_int(request: Request, ctx: RunContext) -> str:
    return 42  # type: ignore[return-value]  # the bad return under test


async def _returns_none(request: Request, ctx: RunContext) -> str:
    return None  # type: ignore[return-value]  # the bad return under test


async def _returns_bad_result(request: Request, ctx: RunContext) -> Result:
    return Result(output="x", iterations="three")  # type: ignore[arg-type]  # under test


_NO_WAIT = RetryPolicy(attempts=3, initial=0.0, maximum=0.0, jitter=0.0)
_LONG_WAIT = RetryPolicy(attempts=3, initial=3600.0, maximum=3600.0, jitter=0.0)

_SPECS = (
    AgentSpec(name="conf-echo", runner=_echo),
    AgentSpec(name="conf-echo-interleaved", runner=_echo_interleaved),
    AgentSpec(name="conf-raise-interleaved", runner=_raise_interleaved),
    AgentSpec(name="conf-describe", runner=_describe, prompt="the agent's prompt"),
    AgentSpec(name="conf-result", runner=_full_result),
    AgentSpec(name="conf-status", runner=_reports_status),
    AgentSpec(name="conf-reported-error", runner=_reports_error),
    AgentSpec(name="conf-raise", runner=_raise_builtin),
    AgentSpec(name="conf-raise-custom", runner=_raise_custom),
    AgentSpec(name="conf-hang", runner=_hang),
    AgentSpec(name="conf-late", runner=_late),
    AgentSpec(name="conf-report-return", runner=_report_then_return),
    AgentSpec(name="conf-report-hang", runner=_report_then_hang),
    AgentSpec(name="conf-flaky", runner=_flaky, retry=_NO_WAIT),
    AgentSpec(name="conf-exhausted", runner=_always_transient, retry=_NO_WAIT),
    AgentSpec(name="conf-not-transient", runner=_not_transient, retry=_NO_WAIT),
    AgentSpec(name="conf-backoff-past-deadline", runner=_always_transient, retry=_LONG_WAIT),
    AgentSpec(name="conf-returns-int", runner=_returns_int),
    AgentSpec(name="conf-returns-none", runner=_returns_none),
    AgentSpec(name="conf-returns-bad-result", runner=_returns_bad_result),
)


def _expect(envelope: DelegateResult, status: Status, what: str) -> None:
    require(
        envelope.status is status,
        f"{what} ended {envelope.status.value}, not {status.value} "
        f"(error_type={envelope.error_type!r}, error={envelope.error!r})",
    )


def _delivered(delivered: dict[str, DelegateResult], task_id: str) -> DelegateResult:
    envelope = delivered.get(task_id)
    if envelope is None:
        raise AssertionError(f"{task_id} delivered no envelope to the session mailbox")
    return envelope


class _Suite:
    def __init__(self, backend: Backend, watchdog: float) -> None:
        self.backend = backend
        self.watchdog = watchdog

    def manager(self) -> SubagentManager:
        return SubagentManager(
            _SPECS, backend=self.backend, config=SubagentConfig(max_concurrent_spawns=8)
        )

    async def completed(self) -> None:
        async with self.manager() as manager:
            handle = manager.spawn("conf-echo", "hello")
            envelope = await handle.wait()
            _expect(envelope, Status.COMPLETED, "a spawned runner returning text")
            require(envelope.output == "echo: hello", f"output is {envelope.output!r}")
            require(envelope.task_id == handle.task_id, "the envelope has another task id")
            require(envelope.agent == "conf-echo", f"the envelope's agent is {envelope.agent!r}")
            require(envelope.error == "" and envelope.error_type == "", "a success has an error")
            require(envelope.attempts == 1, f"one run counts {envelope.attempts} attempts")
            envelope = await manager.execute("conf-echo", "in place")
            _expect(envelope, Status.COMPLETED, "an executed runner returning text")
            require(envelope.output == "echo: in place", f"output is {envelope.output!r}")
            handle = manager.spawn("conf-echo", "to the mailbox")
            delivered = await manager.mailbox().wait(handle.task_id, timeout=None)
            if delivered is None:
                raise AssertionError("the envelope never reached the session mailbox")
            require(delivered.output == "echo: to the mailbox", "the mailbox got another output")

    async def request_and_context(self) -> None:
        async with self.manager() as manager:
            handle = manager.spawn("conf-describe", "the task")
            envelope = await handle.wait()
            request = Request(agent="conf-describe", input="the task", prompt="the agent's prompt")
            expected = _description(request, handle.task_id, "conf-describe")
            require(envelope.output == expected, f"the runner saw {envelope.output!r}")
            options = SpawnOptions(prompt="an override", model="model-1", files=("x.txt",))
            handle = manager.spawn("conf-describe", "more", options=options)
            envelope = await handle.wait()
            request = Request(
                agent="conf-describe",
                input="more",
                prompt="an override",
                files=("x.txt",),
                model="model-1",
            )
            expected = _description(request, handle.task_id, "conf-describe")
            require(envelope.output == expected, f"the runner saw {envelope.output!r}")

    async def result_fields(self) -> None:
        async with self.manager() as manager:
            envelope = await manager.spawn("conf-result").wait()
            _expect(envelope, Status.COMPLETED, "a runner returning a full Result")
            require(envelope.output == "with every field", f"output is {envelope.output!r}")
            usage = Usage(input_tokens=11, output_tokens=22)
            require(envelope.usage == usage, f"usage is {envelope.usage}, not {usage}")
            require(envelope.iterations == 3, f"iterations is {envelope.iterations}, not 3")
            files = ("a.py", "b/c.py")
            require(envelope.files_changed == files, f"files are {envelope.files_changed}")
            envelope = await manager.spawn("conf-status").wait()
            _expect(envelope, Status.TIMEOUT, "a Result with status timeout")
            require(envelope.output == "gave up", f"output is {envelope.output!r}")

    async def reported_progress(self) -> None:
        async with self.manager() as manager:
            envelope = await manager.spawn("conf-report-return").wait()
            _expect(envelope, Status.COMPLETED, "a runner that reported, then returned")
            usage = Usage(input_tokens=7, output_tokens=8)
            require(envelope.usage == usage, f"reported usage became {envelope.usage}")
            require(envelope.iterations == 4, f"reported iterations became {envelope.iterations}")
            require(envelope.files_changed == ("r.txt",), "reported files were lost")
            envelope = await manager.spawn("conf-report-hang", timeout=self.watchdog).wait()
            _expect(envelope, Status.TIMEOUT, "a runner that reported, then hung")
            require(envelope.output == "partial output", f"partial output: {envelope.output!r}")
            usage = Usage(input_tokens=1, output_tokens=2)
            require(envelope.usage == usage, f"reported usage became {envelope.usage}")
            require(envelope.iterations == 1, f"reported iterations became {envelope.iterations}")

    async def error_status(self) -> None:
        async with self.manager() as manager:
            envelope = await manager.spawn("conf-raise", "x").wait()
            _expect(envelope, Status.ERROR, "a runner that raised")
            envelope = await manager.execute("conf-raise", "x")
            _expect(envelope, Status.ERROR, "an executed runner that raised")
            envelope = await manager.spawn("conf-reported-error").wait()
            _expect(envelope, Status.ERROR, "a Result with an error")
            require(
                "the runner reports a failure" in envelope.error,
                f"a reported error became {envelope.error!r}",
            )

    async def exception_text(self) -> None:
        text = "naïve ✓ 42"
        async with self.manager() as manager:
            envelope = await manager.spawn("conf-raise", text).wait()
            require(envelope.error_type == "ValueError", f"error_type is {envelope.error_type!r}")
            wanted = f"conformance failure: {text}"
            require(wanted in envelope.error, f"error is {envelope.error!r}, lacking {wanted!r}")
            envelope = await manager.spawn("conf-raise-custom", text).wait()
            require(
                envelope.error_type.endswith("ConformanceRunnerError"),
                f"a user exception's error_type is {envelope.error_type!r}",
            )
            wanted = f"custom failure: {text}"
            require(wanted in envelope.error, f"error is {envelope.error!r}, lacking {wanted!r}")

    async def timeout(self) -> None:
        async with self.manager() as manager:
            start = anyio.current_time()
            # All three at once: the check waits one watchdog, not three.
            hung = manager.spawn("conf-hang", timeout=self.watchdog)
            late = manager.spawn("conf-late", timeout=self.watchdog)
            executed = await manager.execute("conf-hang", timeout=self.watchdog)
            envelope = await hung.wait()
            elapsed = anyio.current_time() - start
            _expect(envelope, Status.TIMEOUT, "a hung spawned runner")
            require(envelope.error_type == "timeout", f"error_type is {envelope.error_type!r}")
            require(elapsed >= self.watchdog * 0.8, f"timed out after {elapsed} s")
            _expect(executed, Status.TIMEOUT, "a hung executed runner")
            _expect(await late.wait(), Status.TIMEOUT, "a runner returning after its watchdog")

    async def cancellation(self) -> None:
        async with self.manager() as manager:
            handle = manager.spawn("conf-hang")
            await anyio.wait_all_tasks_blocked()
            require(manager.cancel(handle.task_id) is True, "cancel of a running child failed")
            envelope = await handle.wait()
            _expect(envelope, Status.CANCELLED, "a cancelled runner")
            require(envelope.error_type == "cancelled", f"error_type is {envelope.error_type!r}")
            handle = manager.spawn("conf-hang", session_id="conf-closing")
            await anyio.wait_all_tasks_blocked()
            await manager.close_session("conf-closing")
            envelope = await handle.wait()
            _expect(envelope, Status.CANCELLED, "a runner whose session was closed")

            async def delegate() -> None:
                await manager.execute("conf-hang", session_id="conf-caller")

            async with anyio.create_task_group() as tg:
                tg.start_soon(delegate)
                await anyio.wait_all_tasks_blocked()
                tg.cancel_scope.cancel()
            [handle] = manager.tasks("conf-caller")
            envelope = await handle.wait()
            _expect(envelope, Status.CANCELLED, "an execute whose caller was cancelled")

    async def retries(self) -> None:
        async with self.manager() as manager:
            envelope = await manager.spawn("conf-flaky").wait()
            _expect(envelope, Status.COMPLETED, "a runner failing transiently twice of three")
            require(envelope.attempts == 3, f"attempts is {envelope.attempts}, not 3")
            wanted = "succeeded on attempt 3"
            require(envelope.output == wanted, f"output is {envelope.output!r}")
            envelope = await manager.spawn("conf-exhausted").wait()
            _expect(envelope, Status.ERROR, "a runner failing transiently every time")
            require(envelope.attempts == 3, f"attempts is {envelope.attempts}, not 3")
            wanted = "transient failure on attempt 3"
            require(wanted in envelope.error, f"the last error is {envelope.error!r}")
            envelope = await manager.spawn("conf-not-transient").wait()
            _expect(envelope, Status.ERROR, "a runner failing permanently")
            require(envelope.attempts == 1, f"a permanent error was retried: {envelope.attempts}")
            # A backoff that would outlast the watchdog is not slept: the last error ends it.
            start = anyio.current_time()
            envelope = await manager.spawn("conf-backoff-past-deadline", timeout=10.0).wait()
            elapsed = anyio.current_time() - start
            _expect(envelope, Status.ERROR, "a retry whose backoff passes the watchdog")
            require(
                envelope.attempts == 1, f"it was retried past the watchdog: {envelope.attempts}"
            )
            require(elapsed < 5.0, f"it slept {elapsed:.1f} s of backoff before ending")

    async def bad_return(self) -> None:
        cases = (
            ("conf-returns-int", "int"),
            ("conf-returns-none", "NoneType"),
            ("conf-returns-bad-result", "iterations"),
        )
        async with self.manager() as manager:
            for agent, named in cases:
                envelope = await manager.spawn(agent).wait()
                _expect(envelope, Status.ERROR, f"{agent}'s bad return")
                require(
                    envelope.error_type.endswith("RunnerReturnError"),
                    f"{agent}: error_type is {envelope.error_type!r}",
                )
                require(named in envelope.error, f"{agent}: {envelope.error!r} lacks {named!r}")

    async def concurrent_runs(self) -> None:
        async with self.manager() as manager:
            echoes = {
                manager.spawn("conf-echo-interleaved", f"job {n}"): f"job {n}" for n in range(12)
            }
            raises = {
                manager.spawn("conf-raise-interleaved", f"job {n}"): f"job {n}" for n in range(12)
            }
            for handle in [*echoes, *raises]:
                await handle.done.wait()
            delivered = {e.task_id: e for e in manager.mailbox().drain_all()}
            require(len(delivered) == 24, f"24 children delivered {len(delivered)} envelopes")
            for handle, job in echoes.items():
                envelope = _delivered(delivered, handle.task_id)
                _expect(envelope, Status.COMPLETED, job)
                require(envelope.output == f"echo: {job}", f"{job} got {envelope.output!r}")
            for handle, job in raises.items():
                envelope = _delivered(delivered, handle.task_id)
                _expect(envelope, Status.ERROR, job)
                require(job in envelope.error, f"{job}'s error is {envelope.error!r}")


_CHECKS: tuple[tuple[str, str], ...] = (
    ("completed", "a runner's text ends its child completed, in the session mailbox"),
    ("request_and_context", "the runner receives the request and its own context"),
    ("result_fields", "a Result's output, usage, iterations, files and status reach it"),
    ("reported_progress", "ctx.report's usage, iterations and output reach the envelope"),
    ("error_status", "a runner's exception or reported error ends its child in error"),
    ("exception_text", "the exception's type and text reach the envelope's error"),
    ("timeout", "the manager's watchdog ends a hung runner in timeout"),
    ("cancellation", "cancel, close_session and a cancelled caller end it cancelled"),
    ("retries", "RetryPolicy retries transient failures only, never past the watchdog"),
    ("bad_return", "a runner's bad return value ends its child in an error envelope"),
    ("concurrent_runs", "concurrent children each end in their own envelope"),
)


def backend_checks(
    backend: Backend, *, watchdog: float = 0.1, deadline: float = 30.0
) -> list[Check]:
    """The backend conformance checks, one per promise of a :data:`Backend`.

    Each check enters a new ``SubagentManager(agents, backend=backend)`` with agent types
    of its own (names starting ``conf-``) and ends it before returning.

    Args:
        backend: the backend under test, as ``SubagentManager(backend=...)`` takes it.
        watchdog: seconds of the watchdog given to runners that hang; a backend with a
            slow start may need more.
        deadline: seconds one check may take before it counts as hung.

    Returns:
        :class:`Check` objects in a stable order; run each with ``await check()``, or
        parametrize a pytest test over them (``ids=lambda check: check.name``).
    """
    suite = _Suite(backend, watchdog)
    return [
        Check(name=name, promise=promise, body=getattr(suite, name), deadline=deadline)
        for name, promise in _CHECKS
    ]


async def check_backend(
    backend: Backend,
    *,
    skip: Iterable[str] = (),
    watchdog: float = 0.1,
    deadline: float = 30.0,
) -> None:
    """Run every backend check against ``backend``; see :func:`backend_checks`.

    Runs in the caller's anyio event loop (asyncio or trio) and blocks until every check
    has run; each check is bounded by ``deadline``. ``skip`` names checks to leave out
    (e.g. ``reported_progress`` for a backend whose runners cannot reach ``ctx.report``).

    Raises:
        ConformanceError: one or more checks failed; its ``failures`` maps each failed
            check's name to its :class:`AssertionError`.
        ValueError: ``skip`` names a check that does not exist.
    """
    checks = backend_checks(backend, watchdog=watchdog, deadline=deadline)
    await run_checks("backend", select(checks, skip))
