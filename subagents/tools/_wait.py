"""The ``wait_agent`` tool: wait on one or many children, then hand out their envelopes
within the truncation budget. The waiting itself is :func:`wait_handles`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import anyio

from .._completions import WaitMode
from .._envelope import DelegateResult, bound_text
from .._handle import SpawnHandle
from .._json import JSONValue
from .._record import QUEUED
from .._tool_tracing import ToolSpan
from ._budgets import budget_field, budget_left
from ._schema import ms
from ._structured import water_fill
from ._tool import ToolLimits, ToolResult, error_result

if TYPE_CHECKING:
    from .._manager import SubagentManager

__all__ = ["WaitAgent", "int_arg", "status_of"]

MIN_SHARE: Final = 300
"""Characters a delivered result gets at least before others are deferred to a later call."""
ALREADY: Final = "[already collected earlier; shown again]\n"


def int_arg(value: object) -> int:
    """An integer argument (already normalised by ``_schema``)."""
    assert isinstance(value, int)
    return value


def status_of(handle: SpawnHandle) -> str:
    """``queued``, ``running``, ``cancelling`` or the final status of a child."""
    envelope = handle.result
    if envelope is not None:
        return envelope.status.value
    if handle.cancel_called:
        return "cancelling"
    return handle.state


class WaitAgent:
    """The ``wait_agent`` handler; mixed into the session's tool handlers."""

    manager: SubagentManager
    session_id: str
    limits: ToolLimits
    _owner: SpawnHandle | None

    def _wait_ms(self, requested: int | None) -> tuple[int, bool]:
        ceiling = ms(self.limits.wait_ceiling)
        if requested is None:
            return min(ms(self.limits.wait_timeout), ceiling), False
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
                details={
                    "error": "unknown_task",
                    "task_ids": [str(getattr(e, "task_id", e)) for e in unknown],
                },
                is_error=True,
            )
        requested = None if args.get("timeout_ms") is None else int_arg(args["timeout_ms"])
        timeout_ms, clamped = self._wait_ms(requested)
        waited_from = anyio.current_time()
        # A child's own agent loop waits here: it lends its slot (its children may need
        # it), and taking it back never outlasts the timeout.
        await manager.completions(self.session_id).wait_for(
            handles, mode, timeout=timeout_ms / 1000
        )
        waited_ms = ms(anyio.current_time() - waited_from)
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
        pending_lines = self._pending_lines(pending, limit // 4)
        tail = pending_lines
        # Fresh results first: a repeat of an already collected one never crowds them out.
        finished = [h for h in finished if not h.collected] + [h for h in finished if h.collected]
        # Decide how many finished results fit: each gets at least MIN_SHARE characters
        # (or its full length if shorter); the rest stay uncollected for the next call.
        texts_full = [
            (ALREADY if h.collected else "") + _envelope(h).truncated(limit) for h in finished
        ]
        fixed = sum(len(x) + 1 for x in head) + sum(len(x) + 1 for x in pending_lines) + 200
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
        notes: list[str] = []
        if deferred:
            ids_text = ", ".join(f'"{h.task_id}"' for h in deferred[:5])
            more = f" (+{len(deferred) - 5} more)" if len(deferred) > 5 else ""
            notes.append(
                f"{len(deferred)} more finished result(s) did not fit in this answer and are "
                f"kept for you: call wait_agent again with task_ids [{ids_text}]{more}."
            )
        if repeats:
            notes.append("already collected earlier (not repeated): " + ", ".join(repeats[:10]))
        tail = notes + pending_lines
        # Exact budget now that the notes are known: head, blocks and tail joined by "\n\n".
        head_text, tail_text = "\n".join(head), "\n".join(tail)
        exact = limit - len(head_text) - (len(tail_text) + 2 if tail else 0)
        if pending and count and exact < count * MIN_SHARE:
            # Results matter more than the pending list: shrink it to one line.
            tail = [*notes, f"{len(pending)} still pending; keep working and wait again later."]
            tail_text = "\n".join(tail)
            exact = limit - len(head_text) - len(tail_text) - 2
        shares = water_fill([len(t) + 2 for t in texts_full[:count]], max(exact, count * 3))
        blocks: list[str] = []
        results: list[JSONValue] = []
        for handle, share in zip(delivered, shares, strict=True):
            already = handle.collected
            envelope = self.manager.collect(handle)
            assert envelope is not None
            prefix = ALREADY if already and share - 2 > 2 * len(ALREADY) else ""
            blocks.append(prefix + envelope.truncated(max(share - 2 - len(prefix), 1)))
            results.append(
                {"task_id": handle.task_id, "already_collected": already, **envelope.to_dict()}
            )
        span.link_tasks(delivered)
        content = "\n\n".join([head_text, *blocks, *([tail_text] if tail else [])])
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
        # What the finished children spent is charged by now.
        details.update(budget_field(budget_left(self.manager, self.session_id, self._owner)))
        return ToolResult(content=bound_text(content, limit), details=details)

    def _pending_detail(self, handle: SpawnHandle) -> JSONValue:
        return {
            "task_id": handle.task_id,
            "agent": handle.agent,
            "agent_path": str(handle.agent_path),
            "status": status_of(handle),
            "elapsed_ms": ms(handle.elapsed()),
        }

    def _pending_lines(self, pending: list[SpawnHandle], budget: int) -> list[str]:
        if not pending:
            return []
        lines = ["still pending:"]
        used = len(lines[0])
        for i, handle in enumerate(pending):
            status = status_of(handle)
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


def _envelope(handle: SpawnHandle) -> DelegateResult:
    envelope = handle.result
    assert envelope is not None
    return envelope
