"""The five LLM tools of one session: spawn_agent, wait_agent, delegate_to_agent,
cancel_agent and list_agents. Texts are written for a model; see design/tools.md."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from .._envelope import bound_text, cut_middle
from .._errors import UnknownTask
from .._handle import record_of
from .._json import JSONValue
from .._manager import messenger_of
from .._paths import MAX_NAME_LENGTH, NAME_PATTERN
from .._tool_tracing import ToolSpan
from .._validators import MAX_IDEMPOTENCY_KEY
from ._budgets import BUDGET, budget_arg, budget_field, budget_left, budget_sentence
from ._output import output_schema
from ._schema import Param, ms
from ._tool import Tool, ToolLimits, ToolResult, make_tool
from ._wait import WaitAgent, int_arg, status_of

if TYPE_CHECKING:
    from .._handle import SpawnHandle
    from .._manager import SubagentManager

__all__ = ["build_session_tools", "hints"]


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
TASK_ID_PATTERN: Final = "^[!-~]+$"
"""A task id as the tools take it: visible ASCII, no spaces (ids are 12 hex digits)."""
TASK_ID_MAX: Final = 64
_TASK_ID_FORM: Final = f"a task id: 1 to {TASK_ID_MAX} visible ASCII characters, no spaces"


class SessionTools(WaitAgent):
    """The tool handlers bound to one manager and session."""

    def __init__(self, manager: SubagentManager, session_id: str, limits: ToolLimits) -> None:
        self.manager = manager
        self.session_id = session_id
        self.limits = limits
        # The child owning the session, if any: once its record is forgotten (retention)
        # its id reads as an unused session, so its own handle says whether it has ended.
        try:
            self._owner: SpawnHandle | None = manager.handle(session_id)
        except UnknownTask:
            self._owner = None

    def _check_open(self) -> None:
        # The owner's own record says whether its runner still runs: before any argument
        # is checked, and also once its record is forgotten (the manager would then take
        # the id for a new root session).
        if self._owner is not None:
            record_of(self._owner).check_can_delegate()

    # ------------------------------------------------------------------ spawn_agent

    async def spawn(self, args: dict[str, object], span: ToolSpan) -> ToolResult:
        self._check_open()
        manager = self.manager
        agent = str(args["agent"])
        kwargs: dict[str, object] = {}
        if "timeout_ms" in args:
            kwargs["timeout"] = int_arg(args["timeout_ms"]) / 1000
        name = args.get("name")
        key = args.get("idempotency_key")
        created = manager.statistics().spawned
        handle = manager.spawn(
            agent,
            str(args["input"]),
            session_id=self.session_id,
            name=None if name is None else str(name),
            idempotency_key=None if key is None else str(key),
            budget=budget_arg(args.get("budget")),
            **kwargs,  # type: ignore[arg-type]
        )
        stats = manager.statistics()
        # A repeat of a keyed spawn creates no child: it answers with the task it names.
        existing = stats.spawned == created
        if existing:
            status = status_of(handle)
        else:
            status = "running" if handle.queue_position == 0 else "queued"
        # Children admitted but not yet picked up by a worker start in this same tick:
        # count them as running, as this answer's status does.
        starting = max(0, min(stats.queued, stats.limit - stats.running))
        if existing:
            content = (
                f"task {handle.task_id} ({handle.agent_path}) was already spawned with this "
                f"idempotency_key; nothing new was started. It is {status}: call "
                f'wait_agent with task_ids ["{handle.task_id}"] for its result.'
            )
        else:
            where = (
                "started at once"
                if status == "running"
                else f"queued at position {handle.queue_position} (all {stats.limit} slots busy)"
            )
            content = (
                f"spawned {agent} as task {handle.task_id} ({handle.agent_path}): {where}; "
                f"concurrency limit {stats.limit}. Keep working; when you need the result "
                f'call wait_agent with task_ids ["{handle.task_id}"].'
            )
        left = budget_left(manager, self.session_id, self._owner)
        details: dict[str, JSONValue] = {
            "task_id": handle.task_id,
            "agent": agent,
            "agent_path": str(handle.agent_path),
            "status": status,
            "existing": existing,
            "queue_position": handle.queue_position,
            "concurrency_limit": stats.limit,
            "running": stats.running + starting,
            "queued": stats.queued - starting,
        }
        details.update(budget_field(left))
        return ToolResult(content=content + budget_sentence(left), details=details)

    # ------------------------------------------------------------------ delegate_to_agent

    async def delegate(self, args: dict[str, object], span: ToolSpan) -> ToolResult:
        self._check_open()
        manager = self.manager
        agent = str(args["agent"])
        spec = manager.get_agent(agent)
        ceiling = self.limits.delegate_ceiling
        requested = args.get("timeout_ms")
        clamped = False
        if requested is not None:
            timeout: float | None = int_arg(requested) / 1000
        else:
            timeout = spec.timeout if spec.timeout is not None else manager.config.execute_timeout
        if ceiling is not None and (timeout is None or timeout > ceiling):
            clamped = requested is not None
            timeout = ceiling
        envelope = await manager.execute(
            agent,
            str(args["input"]),
            session_id=self.session_id,
            timeout=timeout,
            budget=budget_arg(args.get("budget")),
        )
        limit = self.limits.truncate_chars
        details: dict[str, JSONValue] = {
            "task_id": envelope.task_id,
            "status": envelope.status.value,
            "timeout_ms": None if timeout is None else ms(timeout),
            "clamped": clamped,
        }
        if requested is not None:
            details["requested_timeout_ms"] = int_arg(requested)
        left = budget_left(manager, self.session_id, self._owner)
        details.update(budget_field(left))
        if self.limits.return_mode == "string":
            if envelope.ok:
                text = envelope.output
                if len(text) > limit:
                    text = cut_middle(text, limit)
                return ToolResult(content=text, details=details)
            details["error"] = "agent_failed"
            details["error_type"] = envelope.error_type or envelope.status.value
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
                f"note: timeout_ms {requested} was lowered to {ms(timeout or 0)} so the "
                "result arrives before this tool call itself times out.\n"
            )
        note += budget_sentence(left).lstrip() + ("\n" if left else "")
        return ToolResult(content=note + envelope.truncated(limit - len(note)), details=details)

    # ------------------------------------------------------------------ cancel_agent

    async def cancel(self, args: dict[str, object], span: ToolSpan) -> ToolResult:
        handle = self.manager.handle(str(args["task_id"]), session_id=self.session_id)
        previous = status_of(handle)
        requested = handle.cancel()
        now = status_of(handle)
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
        elif not handle.cancel_called:
            # The runner has returned (its outcome is decided) and the child is settling
            # its own children: it is finishing, not being cancelled.
            content = (
                f"task {handle.task_id} has already returned and is finishing; nothing to "
                "cancel. Collect its result with wait_agent."
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
        limit = list_limit(self.limits)
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
        store = manager.store
        looked_in: list[JSONValue] = ["memory"] if store is None else ["memory", store.path]
        if children:
            lines.append(f"your subagents ({len(children)}):")
        elif store is None:
            lines.append("your subagents: none")
        else:  # a restart lists only this process's children: say where the others are
            lines.append(
                "your subagents: none in this process's memory; tasks of earlier runs stay in "
                f"the store {store.path}, and wait_agent answers for their ids"
            )
        messenger = messenger_of(manager)
        own_unread = messenger.unread(self.session_id)
        if own_unread:
            lines.append(f"you have {own_unread} unread message(s): call read_messages.")
        shown = 0
        budget = limit - sum(len(line) + 1 for line in lines) - 60
        for handle in children:
            waiting = handle.result is not None and not handle.collected
            status = status_of(handle)
            elapsed = handle.elapsed()
            unread = messenger.unread(handle.task_id)
            child_details.append(
                {
                    "task_id": handle.task_id,
                    "agent": handle.agent,
                    "agent_path": str(handle.agent_path),
                    "status": status,
                    "elapsed_ms": ms(elapsed),
                    "result_waiting": waiting,
                    "unread": unread,
                }
            )
            line = f"- {handle.task_id} {handle.agent_path} {status} {elapsed:.1f} s" + (
                " · result waiting (wait_agent)" if waiting else ""
            )
            if unread:
                line += f" · {unread} unread message(s)"
            if budget - len(line) - 1 >= 0:
                lines.append(line)
                budget -= len(line) + 1
                shown += 1
        if shown < len(children):
            lines.append(f"(+{len(children) - shown} more; details list them all)")
        content = bound_text("\n".join(lines), limit)
        return ToolResult(
            content=content,
            details={
                "agents": agent_details,
                "tasks": child_details,
                "looked_in": looked_in,
                "unread": own_unread,
            },
        )


_TIMEOUT_SPAWN = Param(
    name="timeout_ms",
    kind="integer",
    minimum=1,
    description="Optional watchdog for the subagent in milliseconds from its start; "
    "omit for the default. When it fires the subagent ends with status timeout and "
    "whatever partial output it reported.",
)


def list_limit(limits: ToolLimits) -> int:
    """The bound of ``list_agents``' text: twice the others', as it lists every agent type."""
    return 2 * limits.truncate_chars


def hints(
    *, read_only: bool, destructive: bool, idempotent: bool, open_world: bool
) -> dict[str, bool]:
    """MCP tool annotations (behaviour hints for clients)."""
    return {
        "readOnlyHint": read_only,
        "destructiveHint": destructive,
        "idempotentHint": idempotent,
        "openWorldHint": open_world,
    }


def build_session_tools(
    manager: SubagentManager, session_id: str, limits: ToolLimits
) -> list[Tool]:
    """The five tools bound to ``session_id``."""
    impl = SessionTools(manager, session_id, limits)
    engine = limits.engine_timeouts
    wait_default = ms(limits.wait_timeout)
    wait_max = ms(limits.wait_ceiling)
    return [
        make_tool(
            name="spawn_agent",
            output_schema=output_schema("spawn_agent"),
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
                    max_length=MAX_NAME_LENGTH,
                    pattern=NAME_PATTERN,
                    form=f"1 to {MAX_NAME_LENGTH} letters, digits, '_', '-' or '.', "
                    "starting with a letter or digit",
                ),
                _TIMEOUT_SPAWN,
                BUDGET,
                Param(
                    name="idempotency_key",
                    kind="string",
                    description="Optional key naming this piece of work: calling spawn_agent "
                    "again with the same key and the same agent and input (a retried call) "
                    "returns the task it started instead of starting another.",
                    min_length=1,
                    max_length=MAX_IDEMPOTENCY_KEY,
                    form=f"1 to {MAX_IDEMPOTENCY_KEY} characters",
                ),
            ],
            handler=impl.spawn,
            annotations=hints(
                read_only=False, destructive=False, idempotent=False, open_world=True
            ),
            engine_timeout=engine["spawn_agent"],
            content_limit=limits.truncate_chars,
            transfers=True,
        ),
        make_tool(
            name="wait_agent",
            output_schema=output_schema("wait_agent"),
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
                    max_length=TASK_ID_MAX,
                    pattern=TASK_ID_PATTERN,
                    form=_TASK_ID_FORM,
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
            annotations=hints(
                read_only=False, destructive=False, idempotent=False, open_world=False
            ),
            engine_timeout=engine["wait_agent"],
            content_limit=limits.truncate_chars,
        ),
        make_tool(
            name="delegate_to_agent",
            output_schema=output_schema("delegate_to_agent"),
            title="Delegate to subagent",
            description=(
                "Run a subagent and wait for its result in this call (synchronous). Use it "
                "when you cannot continue without the result; otherwise prefer spawn_agent. "
                "Returns the result envelope: status (completed, error, timeout, "
                "cancelled), output (long output is shortened in the middle), error and a "
                "hint on failure. A long task is stopped before this call's own time limit "
                "and returned with status timeout and its partial output."
            ),
            params=[_AGENT, _INPUT, _TIMEOUT_SPAWN, BUDGET],
            handler=impl.delegate,
            annotations=hints(
                read_only=False, destructive=False, idempotent=False, open_world=True
            ),
            engine_timeout=engine["delegate_to_agent"],
            content_limit=limits.truncate_chars,
            transfers=True,
        ),
        make_tool(
            name="cancel_agent",
            output_schema=output_schema("cancel_agent"),
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
                    max_length=TASK_ID_MAX,
                    pattern=TASK_ID_PATTERN,
                    form=_TASK_ID_FORM,
                )
            ],
            handler=impl.cancel,
            annotations=hints(read_only=False, destructive=True, idempotent=True, open_world=False),
            engine_timeout=engine["cancel_agent"],
            content_limit=limits.truncate_chars,
        ),
        make_tool(
            name="list_agents",
            output_schema=output_schema("list_agents"),
            title="List agents",
            description=(
                "List the agent types you can spawn or delegate to, with what each is good "
                "at, and your subagents with their status, elapsed time, path and whether "
                "a result is waiting to be collected with wait_agent."
            ),
            params=[],
            handler=impl.list_agents,
            annotations=hints(read_only=True, destructive=False, idempotent=True, open_world=False),
            engine_timeout=engine["list_agents"],
            content_limit=list_limit(limits),
        ),
    ]
