"""What an event log says about a run: counts, latency percentiles, tokens, failures,
and the totals of each delegation tree.

Built from ``subagent.completed`` events (whose payload is the full envelope); a task
that was spawned but never completed is counted as unfinished. A tree is a task spawned
into a session that is no task of the log (a root session) with everything below it: a
child's events name its parent's task id as their session.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import attrs

from ._events import COMPLETED, MISSED, SPAWNED, Event
from ._json import JSONValue

__all__ = ["EventSummary", "TaskLine", "TreeLine", "percentile", "summarize_events"]

SLOWEST_SHOWN = 5
TREES_SHOWN = 10


def percentile(values: Sequence[int], p: float) -> int:
    """Nearest-rank percentile of ``values`` (0 for none): the smallest value with at
    least ``p`` percent of the values at or below it."""
    if not values:
        return 0
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@attrs.frozen(kw_only=True)
class TaskLine:
    """One task in the summary's lists of slowest and failed tasks."""

    task_id: str
    """The task's id."""
    agent: str
    """Its agent type."""
    agent_path: str
    """Its place in the tree."""
    status: str
    """How it ended."""
    duration_ms: int
    """Wall time including the queue."""
    error_type: str = ""
    """For failures: ``timeout``, ``cancelled`` or the exception class."""
    error: str = ""
    """For failures: the short error message."""

    def to_dict(self) -> dict[str, JSONValue]:
        """JSON-ready dict."""
        return attrs.asdict(self)


@attrs.frozen(kw_only=True)
class TreeLine:
    """The totals of one delegation tree: its top task and everything below it."""

    task_id: str
    """The top task's id."""
    agent: str
    """Its agent type (``?`` if the log has no end of it)."""
    agent_path: str
    """Its place, e.g. ``/root/planner``."""
    session_id: str
    """The root session it was spawned into."""
    status: str
    """How the top task ended, or ``unfinished``."""
    agents: int
    """Tasks in the tree, the top one included."""
    input_tokens: int
    """Input tokens of every ended task of the tree, each its own."""
    output_tokens: int
    """Output tokens, likewise."""

    def to_dict(self) -> dict[str, JSONValue]:
        """JSON-ready dict."""
        return attrs.asdict(self)


@attrs.frozen(kw_only=True)
class LatencyStats:
    """Duration percentiles in milliseconds."""

    count: int
    """How many durations."""
    p50_ms: int
    """Median."""
    p95_ms: int
    """95th percentile."""
    max_ms: int
    """Largest."""

    @classmethod
    def of(cls, durations: Sequence[int]) -> LatencyStats:
        """Statistics of ``durations``."""
        return cls(
            count=len(durations),
            p50_ms=percentile(durations, 50),
            p95_ms=percentile(durations, 95),
            max_ms=max(durations, default=0),
        )

    def to_dict(self) -> dict[str, JSONValue]:
        """JSON-ready dict."""
        return attrs.asdict(self)


@attrs.frozen(kw_only=True)
class EventSummary:
    """The digest of an event log."""

    events: int
    """Events read."""
    completed: int
    """Tasks that ended (any status)."""
    unfinished: list[str]
    """Task ids spawned but never completed in the log."""
    missed: int
    """Events a stream reported as dropped (``subagent.missed`` markers)."""
    by_status: dict[str, int]
    """Ended tasks per status."""
    by_agent: dict[str, dict[str, int]]
    """Ended tasks per agent, then per status."""
    latency: LatencyStats
    """Durations of all ended tasks."""
    latency_by_agent: dict[str, LatencyStats]
    """Durations per agent."""
    tokens_by_agent: dict[str, dict[str, int]]
    """``{"input_tokens": .., "output_tokens": ..}`` per agent (each task its own only)."""
    slowest: list[TaskLine]
    """The slowest ended tasks, slowest first."""
    failed: list[TaskLine]
    """Every task that did not complete, in log order."""
    trees: list[TreeLine] = attrs.field(factory=list)
    """Every delegation tree of the log, the most tokens first."""

    def to_dict(self) -> dict[str, JSONValue]:
        """JSON-ready dict."""
        return {
            "events": self.events,
            "completed": self.completed,
            "unfinished": list(self.unfinished),
            "missed": self.missed,
            "by_status": dict(self.by_status),
            "by_agent": {k: dict(v) for k, v in self.by_agent.items()},
            "latency": self.latency.to_dict(),
            "latency_by_agent": {k: v.to_dict() for k, v in self.latency_by_agent.items()},
            "tokens_by_agent": {k: dict(v) for k, v in self.tokens_by_agent.items()},
            "slowest": [t.to_dict() for t in self.slowest],
            "failed": [t.to_dict() for t in self.failed],
            "trees": [t.to_dict() for t in self.trees],
        }

    def format(self) -> str:
        """A human-readable report (``"no events"`` for an empty log)."""
        if not self.events:
            return "no events"
        durations = (
            f"durations: p50 {self.latency.p50_ms} ms · p95 {self.latency.p95_ms} ms · "
            f"max {self.latency.max_ms} ms"
            if self.latency.count
            else "durations: none (no task ended)"
        )
        out = [
            f"events: {self.events}   tasks ended: {self.completed}   "
            f"unfinished: {len(self.unfinished)}"
            + (f"   missed events: {self.missed}" if self.missed else ""),
            "",
            "status: "
            + (", ".join(f"{k} {v}" for k, v in sorted(self.by_status.items())) or "none"),
            durations,
            "",
            "by agent:" if self.by_agent else "by agent: none",
        ]
        for agent in sorted(self.by_agent):
            counts = ", ".join(f"{k} {v}" for k, v in sorted(self.by_agent[agent].items()))
            lat = self.latency_by_agent[agent]
            tok = self.tokens_by_agent.get(agent, {})
            out.append(
                f"  {agent}: {counts} · p50 {lat.p50_ms} ms · p95 {lat.p95_ms} ms · "
                f"max {lat.max_ms} ms · tokens in {tok.get('input_tokens', 0)} / "
                f"out {tok.get('output_tokens', 0)}"
            )
        if self.slowest:
            out += ["", "slowest:"]
            out += [
                f"  {t.duration_ms} ms  {t.task_id}  {t.agent_path or t.agent}  {t.status}"
                for t in self.slowest
            ]
        if self.failed:
            out += ["", "failed:"]
            for t in self.failed:
                detail = "  " + " ".join(t.error.split())[:200] if t.error else ""
                out.append(
                    f"  {t.task_id}  {t.agent_path or t.agent}  {t.status}"
                    f" ({t.error_type or t.status}){detail}"
                )
        if self.trees:
            out += ["", f"trees ({len(self.trees)}, the most tokens first):"]
            out += [
                f"  tokens in {t.input_tokens} / out {t.output_tokens}  agents {t.agents}  "
                f"{t.task_id}  {t.agent_path or t.agent}  {t.status}"
                for t in self.trees[:TREES_SHOWN]
            ]
            if len(self.trees) > TREES_SHOWN:
                out.append(f"  (+{len(self.trees) - TREES_SHOWN} more; --json lists them all)")
        if self.unfinished:
            shown = ", ".join(self.unfinished[:10])
            more = len(self.unfinished) - 10
            out += ["", f"unfinished: {shown}" + (f" (+{more} more)" if more > 0 else "")]
        return "\n".join(out)


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _str(value: object, default: str = "") -> str:
    return value if isinstance(value, str) else default


def summarize_events(events: Iterable[Event], *, slowest: int = SLOWEST_SHOWN) -> EventSummary:
    """Digest a stream of events (e.g. :func:`read_events`) into an :class:`EventSummary`.

    A task completed twice in the log (it should not happen) counts once, the last wins.
    """
    count = 0
    missed = 0
    spawned: dict[str, None] = {}
    parents: dict[str, tuple[str, str]] = {}  # task id -> (its session, its path)
    ended: dict[str, TaskLine] = {}
    usage: dict[str, tuple[int, int]] = {}
    for event in events:
        count += 1
        if event.type in (SPAWNED, COMPLETED) and event.task_id:
            parents.setdefault(event.task_id, (event.session_id, event.agent_path))
        if event.type == SPAWNED:
            spawned[event.task_id] = None
        elif event.type == MISSED:
            missed += _int(event.data.get("missed"))
        elif event.type == COMPLETED:
            data = event.data
            task_id = _str(data.get("task_id"), event.task_id)
            status = _str(data.get("status"), "unknown")
            ended.pop(task_id, None)
            ended[task_id] = TaskLine(
                task_id=task_id,
                agent=_str(data.get("agent"), "?"),
                agent_path=_str(data.get("agent_path"), event.agent_path),
                status=status,
                duration_ms=_int(data.get("duration_ms")),
                error_type=_str(data.get("error_type")) if status != "completed" else "",
                error=_str(data.get("error")) if status != "completed" else "",
            )
            tokens = data.get("usage")
            if isinstance(tokens, dict):
                usage[task_id] = (
                    _int(tokens.get("input_tokens")),
                    _int(tokens.get("output_tokens")),
                )
            else:
                usage.pop(task_id, None)
    by_status: dict[str, int] = {}
    by_agent: dict[str, dict[str, int]] = {}
    durations: dict[str, list[int]] = {}
    tokens_by_agent: dict[str, dict[str, int]] = {}
    for task in ended.values():
        by_status[task.status] = by_status.get(task.status, 0) + 1
        per = by_agent.setdefault(task.agent, {})
        per[task.status] = per.get(task.status, 0) + 1
        durations.setdefault(task.agent, []).append(task.duration_ms)
        tin, tout = usage.get(task.task_id, (0, 0))
        tok = tokens_by_agent.setdefault(task.agent, {"input_tokens": 0, "output_tokens": 0})
        tok["input_tokens"] += tin
        tok["output_tokens"] += tout
    all_durations = [t.duration_ms for t in ended.values()]
    ordered = sorted(ended.values(), key=lambda t: t.duration_ms, reverse=True)
    return EventSummary(
        events=count,
        completed=len(ended),
        unfinished=[t for t in spawned if t not in ended],
        missed=missed,
        by_status=by_status,
        by_agent=by_agent,
        latency=LatencyStats.of(all_durations),
        latency_by_agent={agent: LatencyStats.of(d) for agent, d in durations.items()},
        tokens_by_agent=tokens_by_agent,
        slowest=ordered[:slowest],
        failed=[t for t in ended.values() if t.status != "completed"],
        trees=_trees(parents, ended, usage),
    )


def _trees(
    parents: dict[str, tuple[str, str]],
    ended: dict[str, TaskLine],
    usage: dict[str, tuple[int, int]],
) -> list[TreeLine]:
    """Each task summed into the tree of its top task (found by following sessions up)."""
    top_of: dict[str, str] = {}
    totals: dict[str, list[int]] = {}
    for task_id in parents:
        chain = [task_id]
        session = parents[task_id][0]
        while session in parents and session not in top_of and session not in chain:
            chain.append(session)
            session = parents[session][0]
        top = top_of.get(session, chain[-1])
        for member in chain:
            top_of[member] = top
        tin, tout = usage.get(task_id, (0, 0))
        total = totals.setdefault(top, [0, 0, 0])
        total[0] += 1
        total[1] += tin
        total[2] += tout
    lines = []
    for top, (agents, tin, tout) in totals.items():
        line = ended.get(top)
        lines.append(
            TreeLine(
                task_id=top,
                agent="?" if line is None else line.agent,
                agent_path=parents[top][1] if line is None else line.agent_path,
                session_id=parents[top][0],
                status="unfinished" if line is None else line.status,
                agents=agents,
                input_tokens=tin,
                output_tokens=tout,
            )
        )
    lines.sort(key=lambda t: t.input_tokens + t.output_tokens, reverse=True)
    return lines
