"""The five LLM tools of one session: spawn_agent, wait_agent, delegate_to_agent,
cancel_agent and list_agents. Texts are written for a model; see design/tools.md."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import anyio

from ._envelope import DelegateResult, _cut_middle, bound_text
from ._handle import QUEUED, SpawnHandle
from ._json import JSONValue
from ._tool_wait import WaitMode, session_signal, wait_handles
from ._tools import Tool, ToolLimits, ToolResult, error_result, make_tool
from ._tracing import ToolSpan
from ._validate import Param

if TYPE_CHECKING:
    from ._manager import SubagentManager

__all__ = ["build_session_tools"]

MIN_SHARE: Final = 300
"""Characters a delivered result gets at least before others are deferred to a later call."""
ALREADY: Final = "[already collected by an earlier wait_agent call; shown again]\n"

_AGENT = Param(
    name="agent",
    kind="string",
    required=True,
    description="Name of a registered agent type (list_agents shows them).",
)
_INPUT = Param(
    name="input",
    kind="string",
    required=True,
    description="The complete task for the subagent: it sees nothing of your conversation.",
)


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


def _status_of(handle: SpawnHandle) -> str:
    envelope = handle.result
    if envelope is not None:
        return envelope.status.value
    if handle._cancel_requested:
        return "cancelling"
    return handle.state


class SessionTools:
    """The tool handlers bound to one manager and session."""

    def __init__(self, manager: SubagentManager, session_id: str, limits: ToolLimits) -> None:
        self.manager = manager
        self.session_id = session_id
        self.limits = limits

    # ------------------------------------------------------------------ spawn_agent

    async def spawn(self, args: dict[str, object], span: ToolSpan) -> ToolResult:
        manager = self.manager
        agent = str(args["agent"])
        kwargs: dict[str, object] = {}
        if "timeout_ms" in args:
            kwargs["timeout"] = _int(args["timeout_ms"]) / 1000
        name = args.get("name")
        handle = manager.spawn(
            agent,
            str(args["input"]),
            session_id=self.session_id,
            name=None if name is None else str(name),
            **kwargs,  # type: ignore[arg-type]
        )
        stats = manager.statistics()
        status = "running" if handle.queue_position == 0 else "queued"
        where = (
            "started at once"
            if status == "running"
            else f"queued at position {handle.queue_position} (all {stats.limit} slots busy)"
        )
        content = (
            f"spawned {agent} as task {handle.task_id} ({handle.agent_path}): {where}; "
            f"concurrency limit {stats.limit}. Keep working; when you need the result call "
            f'wait_agent with task_ids ["{handle.task_id}"].'
        )
        return ToolResult(
            content=content,
            details={
                "task_id": handle.task_id,
                "agent": agent,
                "agent_path": str(handle.agent_path),
                "status": status,
                "queue_position": handle.queue_position,
                "concurrency_limit": stats.limit,
                "running": stats.running,
                "queued": stats.queued,
            },
        )

    # ------------------------------------------------------------------ delegate_to_agent

    async def delegate(self, args: dict[str, object], span: ToolSpan) -> ToolResult:
        manager = self.manager
        agent = str(args["agent"])
        spec = manager.get_agent(agent)
        ceiling = self.limits.delegate_ceiling
        requested = args.get("timeout_ms")
        clamped = False
        if requested is not None:
            timeout: float | None = _int(requested) / 1000
        else:
            timeout = spec.timeout if spec.timeout is not None else manager.config.execute_timeout
        if ceiling is not None and (timeout is None or timeout > ceiling):
            clamped = requested is not None
            timeout = ceiling
        envelope = await manager.execute(
            agent, str(args["input"]), session_id=self.session_id, timeout=timeout
        )
        limit = self.limits.truncate_chars
        details: dict[str, JSONValue] = {
            "task_id": envelope.task_id,
            "status": envelope.status.value,
            "timeout_ms": None if timeout is None else _ms(timeout),
            "clamped": clamped,
        }
        if requested is not None:
            details["requested_timeout_ms"] = _int(requested)
        if self.limits.return_mode == "string":
            if envelope.ok:
                text = envelope.output
                if len(text) > limit:
                    text = _cut_middle(text, limit)
                return ToolResult(content=text, details=details)
            return ToolResult(
                content=bound_text(
                    f"{agent} failed ({envelope.status.value}): {envelope.error or 'no detail'}",
                    limit,
                ),
                details=details,
                is_error=True,
            )
        details["envelope"] = envelope.to_dict()
        note = ""
        if clamped:
            note = (
                f"note: timeout_ms {requested} was lowered to {_ms(timeout or 0)} so the "
                "result arrives before this tool call itself times out.\n"
            )
        return ToolResult(content=note + envelope.truncated(limit - len(note)), details=details)

    # ------------------------------------------------------------------ cancel_agent

    async def cancel(self, args: dict[str, object], span: ToolSpan) -> ToolResult:
        handle = self.manager.handle(str(args["task_id"]), session_id=self.session_id)
        previous = _status_of(handle)
        requested = handle.cancel()
        now = _status_of(handle)
        if requested:
            if now == "cancelled":
                content = f"task {handle.task_id} was {previous}; it is now cancelled."
            else:
                content = (
                    f"task {handle.task_id} was {previous}; cancellation requested, it stops "
                    "at its next checkpoint and its envelope (status cancelled, with any "
                    "partial output) can be collected with wait_agent."
                )
        elif handle.result is not None:
            content = (
                f"task {handle.task_id} had already ended ({previous}); nothing to cancel."
                + ("" if handle.collected else " Its result is waiting: call wait_agent.")
            )
        else:
            content = f"task {handle.task_id} is already being cancelled."
        return ToolResult(
            content=content,
            details={
                "task_id": handle.task_id,
                "previous_status": previous,
                "status": now,
                "cancel_requested": requested,
            },
        )

    # ------------------------------------------------------------------ list_agents

    async def list_agents(self, args: dict[str, object], span: ToolSpan) -> ToolResult:
        manager = self.manager
        limit = 2 * self.limits.truncate_chars
        agents = manager.agents
        lines = ["agent types (use with spawn_agent / delegate_to_agent):"]
        agent_details: list[JSONValue] = []
        for name, spec in agents.items():
            lines.append(f"- {name}: {bound_text(' '.join(spec.description.split()), 200)}")
            agent_details.append({"name": name, "description": spec.description})
        if not agents:
            lines.append("- (none registered: do the work yourself)")
        children = manager.tasks(self.session_id)
        # Results waiting first, then live children, then what was already collected.
        children.sort(key=lambda h: 1 if h.result is None else (0 if not h.collected else 2))
        child_details: list[JSONValue] = []
        lines.append(f"your subagents ({len(children)}):" if children else "your subagents: none")
        shown = 0
        budget = limit - sum(len(line) + 1 for line in lines) - 60
        for handle in children:
            waiting = handle.result is not None and not handle.collected
            status = _status_of(handle)
            elapsed = handle.elapsed()
            child_details.append(
                {
                    "task_id": handle.task_id,
                    "agent": handle.agent,
                    "agent_path": str(handle.agent_path),
                    "status": status,
                    "elapsed_ms": _ms(elapsed),
                    "result_waiting": waiting,
                }
            )
            line = f"- {handle.task_id} {handle.agent_path} {status} {elapsed:.1f} s" + (
                " · result waiting (wait_agent)" if waiting else ""
            )
            if budget - len(line) - 1 >= 0:
                lines.append(line)
                budget -= len(line) + 1
                shown += 1
        if shown < len(children):
            lines.append(f"(+{len(children) - shown} more; details list them all)")
        content = bound_text("\n".join(lines), limit)
        return ToolResult(
            content=content,
            details={"agents": agent_details, "tasks": child_details},
        )

    # ------------------------------------------------------------------ wait_agent

    def _wait_ms(self, requested: int | None) -> tuple[int, bool]:
        ceiling = _ms(self.limits.wait_ceiling)
        if requested is None:
            return min(_ms(self.limits.wait_timeout), ceiling), False
        if requested > ceiling:
            return ceiling, True
        return requested, False

    async def wait(self, args: dict[str, object], span: ToolSpan) -> ToolResult:
        manager = self.manager
        ids = [str(i) for i in args["task_ids"]]  # type: ignore[attr-defined]
        mode: WaitMode = "any" if args.get("mode") == "any" else "all"
        handles: list[SpawnHandle] = []
        unknown: list[Exception] = []
        for task_id in ids:
            try:
                handles.append(manager.handle(task_id, session_id=self.session_id))
            except LookupError as exc:
                unknown.append(exc)
        if unknown:
            if len(unknown) == 1:
                return error_result(unknown[0], "wait_agent")
            return ToolResult(
                content=bound_text(
                    "; ".join(str(e) for e in unknown)
                    + ". Nothing was collected; call again with valid ids.",
                    self.limits.truncate_chars,
                ),
                details={"error": "unknown_task", "task_ids": [str(e.args[0]) for e in unknown]},
                is_error=True,
            )
        requested = None if args.get("timeout_ms") is None else _int(args["timeout_ms"])
        timeout_ms, clamped = self._wait_ms(requested)
        waited_from = anyio.current_time()
        with session_signal(manager, self.session_id) as closed:
            if timeout_ms > 0 and not closed.is_set():
                with anyio.move_on_after(timeout_ms / 1000):
                    await wait_handles(handles, mode, closed)
        waited_ms = _ms(anyio.current_time() - waited_from)
        # Read the record after the deadline: a result that landed at the deadline counts.
        finished = [h for h in handles if h.result is not None]
        pending = [h for h in handles if h.result is None]
        completed = bool(finished) if mode == "any" else not pending
        session_closed = manager.session_closed(self.session_id) or not manager.running
        timed_out = not completed and not session_closed
        return self._wait_result(
            span,
            ids=ids,
            mode=mode,
            finished=finished,
            pending=pending,
            completed=completed,
            timed_out=timed_out,
            session_closed=session_closed,
            timeout_ms=timeout_ms,
            requested=requested,
            clamped=clamped,
            waited_ms=waited_ms,
        )

    def _wait_result(
        self,
        span: ToolSpan,
        *,
        ids: list[str],
        mode: WaitMode,
        finished: list[SpawnHandle],
        pending: list[SpawnHandle],
        completed: bool,
        timed_out: bool,
        session_closed: bool,
        timeout_ms: int,
        requested: int | None,
        clamped: bool,
        waited_ms: int,
    ) -> ToolResult:
        limit = self.limits.truncate_chars
        head = [f"wait_agent ({mode}): {len(finished)} of {len(ids)} finished"]
        if timed_out:
            head[0] += f"; timed_out after {timeout_ms} ms (the subagents keep running)"
        if session_closed and not completed:
            head.append(
                "the session was closed: its unfinished subagents are cancelled and no more "
                "results will come; do the remaining work yourself."
            )
        if clamped:
            host = self.limits.engine_timeouts.get("wait_agent")
            why = "" if host is None else f" before its {host:g} s tool timeout"
            head.append(
                f"note: timeout_ms {requested} was clamped to {timeout_ms} so this call "
                f"answers in time{why}; call wait_agent again to keep waiting."
            )
        tail = self._pending_lines(pending, limit // 4)
        # Fresh results first: a repeat of an already collected one never crowds them out.
        finished = [h for h in finished if not h.collected] + [h for h in finished if h.collected]
        # Decide how many finished results fit: each gets at least MIN_SHARE characters
        # (or its full length if shorter); the rest stay uncollected for the next call.
        texts_full = [
            (ALREADY if h.collected else "") + _envelope(h).truncated(limit) for h in finished
        ]
        fixed = sum(len(x) + 1 for x in head) + sum(len(x) + 1 for x in tail) + 200
        avail = max(limit - fixed, MIN_SHARE // 2)
        count, need = 0, 0
        for text in texts_full:
            need += min(len(text), MIN_SHARE) + 2
            if count and need > avail:
                break
            count += 1
        delivered, skipped = finished[:count], finished[count:]
        deferred = [h for h in skipped if not h.collected]
        repeats = [h.task_id for h in skipped if h.collected]
        if repeats:
            tail.insert(0, "already collected earlier (not repeated): " + ", ".join(repeats[:20]))
        shares = _water_fill([len(t) + 2 for t in texts_full[:count]], avail)
        blocks: list[str] = []
        results: list[JSONValue] = []
        for handle, share in zip(delivered, shares, strict=True):
            already = handle.collected
            envelope = self.manager.collect(handle)
            assert envelope is not None
            prefix = ALREADY if already else ""
            blocks.append(prefix + envelope.truncated(max(share - 2 - len(prefix), 1)))
            results.append(
                {"task_id": handle.task_id, "already_collected": already, **envelope.to_dict()}
            )
        if deferred:
            ids_text = ", ".join(f'"{h.task_id}"' for h in deferred[:20])
            tail.insert(
                0,
                f"{len(deferred)} more finished result(s) did not fit in this answer and are "
                f"kept for you: call wait_agent again with task_ids [{ids_text}].",
            )
        span.link_tasks([h.task_id for h in delivered])
        content = "\n\n".join(["\n".join(head), *blocks, *(["\n".join(tail)] if tail else [])])
        details: dict[str, JSONValue] = {
            "completed": completed,
            "timed_out": timed_out,
            "session_closed": session_closed,
            "mode": mode,
            "timeout_ms": timeout_ms,
            "clamped": clamped,
            "waited_ms": waited_ms,
            "results": results,
            "pending": [self._pending_detail(h) for h in pending],
            "deferred": [h.task_id for h in deferred],
        }
        if requested is not None:
            details["requested_timeout_ms"] = requested
        if len(ids) == 1:
            details["task_id"] = ids[0]
        return ToolResult(content=bound_text(content, limit), details=details)

    def _pending_detail(self, handle: SpawnHandle) -> JSONValue:
        return {
            "task_id": handle.task_id,
            "agent": handle.agent,
            "agent_path": str(handle.agent_path),
            "status": _status_of(handle),
            "elapsed_ms": _ms(handle.elapsed()),
        }

    def _pending_lines(self, pending: list[SpawnHandle], budget: int) -> list[str]:
        if not pending:
            return []
        lines = ["still pending:"]
        used = len(lines[0])
        for i, handle in enumerate(pending):
            status = _status_of(handle)
            elapsed = handle.elapsed()
            line = f"- {handle.task_id} ({handle.agent_path}): {status} for {elapsed:.1f} s"
            if handle.state == QUEUED:
                line += " (waiting for a free slot)"
            if used + len(line) + 1 > budget:
                lines.append(f"(+{len(pending) - i} more pending)")
                break
            lines.append(line)
            used += len(line) + 1
        lines.append("keep working and call wait_agent again later; do not poll in a tight loop.")
        return lines


def _int(value: object) -> int:
    assert isinstance(value, int)  # _validate normalised it
    return value


def _envelope(handle: SpawnHandle) -> DelegateResult:
    envelope = handle.result
    assert envelope is not None
    return envelope


def _water_fill(needs: list[int], budget: int) -> list[int]:
    """Share ``budget`` among items needing ``needs``: short ones get all they need, the
    rest split what is left evenly."""
    shares = [0] * len(needs)
    left = budget
    for rank, i in enumerate(sorted(range(len(needs)), key=lambda j: needs[j])):
        share = left // (len(needs) - rank)
        shares[i] = min(needs[i], share)
        left -= shares[i]
    return shares


_TIMEOUT_SPAWN = Param(
    name="timeout_ms",
    kind="integer",
    minimum=1,
    description="Optional watchdog for the subagent in milliseconds from its start; "
    "omit for the default. When it fires the subagent ends with status timeout and "
    "whatever partial output it reported.",
)


def build_session_tools(
    manager: SubagentManager, session_id: str, limits: ToolLimits
) -> list[Tool]:
    """The five tools bound to ``session_id``."""
    impl = SessionTools(manager, session_id, limits)
    engine = limits.engine_timeouts
    wait_default = _ms(limits.wait_timeout)
    wait_max = _ms(limits.wait_ceiling)
    return [
        make_tool(
            name="spawn_agent",
            title="Spawn subagent",
            description=(
                "Start a subagent in the background and return at once with its task id "
                "(it never waits for the subagent, nor for a free slot). Use it for "
                "independent work you can do in parallel; keep working while it runs and "
                "collect the result later with wait_agent. The answer says whether it is "
                "running or queued (at most a fixed number run at once; the rest queue in "
                "order). The subagent sees only `input`, so make it self-contained."
            ),
            params=[
                _AGENT,
                _INPUT,
                Param(
                    name="name",
                    kind="string",
                    description="Optional short name for the subagent's path (letters, "
                    "digits, '_', '-', '.'); defaults to the agent type.",
                ),
                _TIMEOUT_SPAWN,
            ],
            handler=impl.spawn,
            annotations={
                "readOnlyHint": False,
                "destructiveHint": False,
                "idempotentHint": False,
                "openWorldHint": True,
            },
            engine_timeout=engine["spawn_agent"],
            transfers=True,
        ),
        make_tool(
            name="wait_agent",
            title="Wait for subagents",
            description=(
                "Collect the results of subagents started with spawn_agent. Give one task "
                "id or a list; mode 'all' (default) waits until all have finished, 'any' "
                "until at least one has. Returns each finished result (status, output, "
                "error) in compact form, and for unfinished ones their status and elapsed "
                f"time. It waits at most timeout_ms (default {wait_default} ms, at most "
                f"{wait_max} ms; larger values are lowered), then answers with "
                "timed_out=true: the subagents keep running and you can wait again. "
                "timeout_ms 0 checks without waiting. Each result is handed out once; "
                "asking again for a collected id repeats it marked 'already collected'. "
                "Prefer doing other work over calling this repeatedly."
            ),
            params=[
                Param(
                    name="task_ids",
                    kind="ids",
                    required=True,
                    description="A task id from spawn_agent, or a list of them.",
                ),
                Param(
                    name="mode",
                    kind="enum",
                    choices=("all", "any"),
                    default="all",
                    description="'all': wait for every id; 'any': return when one is done.",
                ),
                Param(
                    name="timeout_ms",
                    kind="integer",
                    minimum=0,
                    description=f"Longest wait in milliseconds (default {wait_default}, "
                    f"clamped to {wait_max}); 0 checks without waiting.",
                ),
            ],
            handler=impl.wait,
            annotations={
                "readOnlyHint": False,
                "destructiveHint": False,
                "idempotentHint": False,
                "openWorldHint": False,
            },
            engine_timeout=engine["wait_agent"],
        ),
        make_tool(
            name="delegate_to_agent",
            title="Delegate to subagent",
            description=(
                "Run a subagent and wait for its result in this call (synchronous). Use it "
                "when you cannot continue without the result; otherwise prefer spawn_agent. "
                "Returns the result envelope: status (completed, error, timeout, "
                "cancelled), output (long output is shortened in the middle), error and a "
                "hint on failure. A long task is stopped before this call's own time limit "
                "and returned with status timeout and its partial output."
            ),
            params=[_AGENT, _INPUT, _TIMEOUT_SPAWN],
            handler=impl.delegate,
            annotations={
                "readOnlyHint": False,
                "destructiveHint": False,
                "idempotentHint": False,
                "openWorldHint": True,
            },
            engine_timeout=engine["delegate_to_agent"],
            transfers=True,
        ),
        make_tool(
            name="cancel_agent",
            title="Cancel subagent",
            description=(
                "Stop a subagent started with spawn_agent: a queued one never starts, a "
                "running one is cancelled and ends with status cancelled (its partial "
                "output is kept for wait_agent). Reports the status it had. Safe to repeat."
            ),
            params=[
                Param(
                    name="task_id",
                    kind="string",
                    required=True,
                    description="The task id returned by spawn_agent.",
                )
            ],
            handler=impl.cancel,
            annotations={
                "readOnlyHint": False,
                "destructiveHint": True,
                "idempotentHint": True,
                "openWorldHint": False,
            },
            engine_timeout=engine["cancel_agent"],
        ),
        make_tool(
            name="list_agents",
            title="List agents",
            description=(
                "List the agent types you can spawn or delegate to, with what each is good "
                "at, and your subagents with their status, elapsed time, path and whether "
                "a result is waiting to be collected with wait_agent."
            ),
            params=[],
            handler=impl.list_agents,
            annotations={
                "readOnlyHint": True,
                "destructiveHint": False,
                "idempotentHint": True,
                "openWorldHint": False,
            },
            engine_timeout=engine["list_agents"],
        ),
    ]
