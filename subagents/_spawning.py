"""A spawn's arguments checked and made into its record: the agent, the session, the
depth limit, options given once, the timeout that applies, the child's name and path,
its request and its permissions."""

from __future__ import annotations

from collections.abc import Mapping
from time import perf_counter
from typing import Final

from ._errors import ConfigError, SpawnRejected, UnknownAgent
from ._events import SPAWNED, EventBus
from ._journal import Journal, SpawnEntry, StoredTask
from ._json import JSONValue
from ._paths import AgentPath, child_path
from ._record import SETTLED, ChildRecord
from ._sessions import Sessions
from ._spec import UNSET, AgentSpec, Request, SpawnOptions, SubagentConfig, _Unset
from ._validators import seconds

__all__ = ["Spawner", "publish_spawned"]

_ROOT: Final = AgentPath.root()

_NO_OPTIONS: Final = SpawnOptions()


class Spawner:
    """Keeps the registered agent types; makes the records of new children into
    ``sessions``, journals the spawned ones, and remakes the records of ended ones from the
    journal."""

    def __init__(
        self, sessions: Sessions, config: SubagentConfig, journal: Journal | None = None
    ) -> None:
        self.specs: dict[str, AgentSpec] = {}
        """The registered agent types by name."""
        self._sessions = sessions
        self._config = config
        self._journal = journal

    def register(self, spec: AgentSpec) -> None:
        """Add an agent type. Raises :class:`ConfigError` if the name is taken."""
        if not isinstance(spec, AgentSpec):
            raise ConfigError("agents", "AgentSpec instances", spec)
        if spec.name in self.specs:
            raise ConfigError("agents", "unique agent names", spec.name)
        self.specs[spec.name] = spec

    def reruns(self) -> dict[str, int]:
        """The agents whose unfinished spawns a restart runs again, with their caps."""
        return {n: s.max_attempts for n, s in self.specs.items() if s.resume == "rerun"}

    def agent(self, name: str) -> AgentSpec:
        """The agent type called ``name``; raises :class:`UnknownAgent` listing the known."""
        spec = self.specs.get(name)
        if spec is None:
            raise UnknownAgent(name, self.specs)
        return spec

    def new_record(
        self,
        agent: str,
        input: str,
        session_id: str,
        name: str | None,
        timeout: float | _Unset | None,
        options: SpawnOptions | None,
        sync: bool,
    ) -> tuple[ChildRecord, ChildRecord | None]:
        """The record of a new child of ``session_id`` (and the record of the child owning
        that session, if any), checked in this order: the agent, the input and session
        types, the session open, the depth, the options, the timeout, the name. Raises the
        first problem found, before anything is recorded."""
        spec = self.specs.get(agent)
        if spec is None:
            raise UnknownAgent(agent, self.specs)
        if not isinstance(input, str):
            raise ConfigError("input", "a string", input)
        if not isinstance(session_id, str):
            raise ConfigError("session_id", "a string", session_id)
        parent = self._sessions.check_open(session_id)
        parent_path = _ROOT if parent is None else parent.agent_path
        if (1 if parent is None else parent_path.depth + 1) > self._config.max_depth:
            raise _depth_error(parent_path, self._config.max_depth)
        options = _NO_OPTIONS if options is None else _spawn_options(options, timeout, name)
        default = self._config.execute_timeout if sync else self._config.spawn_timeout
        timeout = _spawn_timeout(timeout, options, spec, default)
        segment = self._sessions.allocate_name(
            session_id, name if name is not None else options.name or spec.name
        )
        record = ChildRecord(
            task_id=self._sessions.new_task_id(journaled=not sync),
            session_id=session_id,
            root_session=session_id if parent is None else parent.root_session,
            spec=spec,
            request=Request(
                agent=spec.name,
                input=input,
                prompt=options.prompt if options.prompt is not None else spec.prompt,
                files=options.files,
                model=options.model if options.model is not None else spec.model,
            ),
            agent_path=child_path(parent_path, segment),
            parent_path=parent_path,
            timeout=timeout,
            permissions=spec.permissions.intersect(
                self._config.permissions if parent is None else parent.permissions
            ),
            spawned_at=perf_counter(),
            sync=sync,
        )
        # Not an execute(): its envelope goes back to its caller, who is gone after a crash.
        if self._journal is not None and not sync:
            record.journaled = self._journal.spawned(_entry(record, parent))
        self._sessions.add(record)
        return record, parent

    def restore(self, task_id: str) -> ChildRecord | None:
        """The record of ``task_id`` if the journal holds it ended (a child of an earlier
        process): settled, delivered, collected unless its envelope is unread."""
        stored = None if self._journal is None else self._journal.lookup(task_id)
        return None if stored is None else self._restored(stored)

    def _restored(self, stored: StoredTask) -> ChildRecord:
        envelope = stored.envelope
        request = stored.request
        spec = self.specs.get(envelope.agent)
        if spec is None:  # no longer registered: a stand-in that never runs
            spec = AgentSpec(name=envelope.agent, runner=_never_runs)
        path = AgentPath(envelope.agent_path) if envelope.agent_path else _ROOT.join(spec.name)
        record = ChildRecord(
            task_id=stored.task_id,
            session_id=stored.session_id,
            root_session=stored.session_id,
            spec=spec,
            request=_request(envelope.agent, request),
            agent_path=path,
            parent_path=path.parent() or _ROOT,
            timeout=None,
            permissions=spec.permissions,
            spawned_at=perf_counter(),
            sync=False,
        )
        record.restored = True
        record.state = SETTLED
        record.envelope = envelope
        record.collected = not stored.unread
        record.mark_delivered()
        return record

    def rerun(self, entry: SpawnEntry) -> ChildRecord:
        """The live record of a root spawn that an ended process left unfinished and the
        journal's recovery claimed for running again: its old task id, path and request;
        journaled already (its row is the journal's). Its agent is registered (recovery
        claims only those)."""
        spec = self.specs[entry.agent]
        path = AgentPath(entry.agent_path)
        timeout = entry.request.get("timeout")
        record = ChildRecord(
            task_id=entry.task_id,
            session_id=entry.session_id,
            root_session=entry.session_id,
            spec=spec,
            request=_request(spec.name, entry.request),
            agent_path=path,
            parent_path=path.parent() or _ROOT,
            timeout=float(timeout) if isinstance(timeout, (int, float)) else None,
            permissions=spec.permissions.intersect(self._config.permissions),
            spawned_at=perf_counter(),
            sync=False,
        )
        record.journaled = JOURNALED_BEFORE
        self._sessions.add(record)
        return record


JOURNALED_BEFORE: Final = 1
"""The journal token of a record whose row an earlier process journaled: the store's
first write, committed before any recovery returns."""


def _request(agent: str, request: Mapping[str, JSONValue]) -> Request:
    """A :class:`Request` from the journal's record of it."""
    return Request(
        agent=agent,
        input=_text(request.get("input")) or "",
        prompt=_text(request.get("prompt")),
        files=tuple(str(f) for f in _list(request.get("files"))),
        model=_text(request.get("model")),
    )


async def _never_runs(request: Request, ctx: object) -> str:  # pragma: no cover - never run
    raise RuntimeError("a restored child's agent is no longer registered")


def _text(value: JSONValue | None) -> str | None:
    return value if isinstance(value, str) else None


def _list(value: JSONValue | None) -> list[JSONValue]:
    return value if isinstance(value, list) else []


def _entry(record: ChildRecord, parent: ChildRecord | None) -> SpawnEntry:
    """What the journal records of a new spawned child."""
    request = record.request
    return SpawnEntry(
        task_id=record.task_id,
        session_id=record.session_id,
        parent_task=None if parent is None else parent.task_id,
        agent=request.agent,
        agent_path=str(record.agent_path),
        request={
            "input": request.input,
            "prompt": request.prompt,
            "model": request.model,
            "files": list(request.files),
            "timeout": record.timeout,
        },
    )


def _spawn_options(
    options: SpawnOptions, timeout: float | _Unset | None, name: str | None
) -> SpawnOptions:
    """``options`` checked: a :class:`SpawnOptions` (or none), and no setting given both
    as an argument and in it (neither may silently win over the other)."""
    if not isinstance(options, SpawnOptions):
        raise ConfigError("options", "a SpawnOptions or None", options)
    if timeout is not UNSET and options.timeout is not None:
        raise ConfigError(
            "timeout",
            f"given once: as timeout= or as options.timeout (here {options.timeout!r}), not both",
            timeout,
        )
    if name is not None and options.name is not None:
        raise ConfigError(
            "name",
            f"given once: as name= or as options.name (here {options.name!r}), not both",
            name,
        )
    return options


def _spawn_timeout(
    timeout: float | _Unset | None, options: SpawnOptions, spec: AgentSpec, default: float | None
) -> float | None:
    """The watchdog seconds that apply: the argument, else the option, else the agent's,
    else ``default``; ``None`` disables the watchdog."""
    if timeout is UNSET:
        if options.timeout is not None:
            return options.timeout
        return spec.timeout if spec.timeout is not None else default
    return None if timeout is None else seconds("timeout", timeout, none_ok=False, zero_ok=False)


def _depth_error(parent_path: AgentPath, max_depth: int) -> SpawnRejected:
    """The error for a child of ``parent_path`` that would be deeper than ``max_depth``
    (``/root`` is at depth 0)."""
    return SpawnRejected(
        "depth",
        f"delegation depth limit reached: {parent_path} is at depth "
        f"{parent_path.depth} and max_depth is {max_depth}, so it cannot have children",
    )


def publish_spawned(events: EventBus, record: ChildRecord) -> None:
    """Publish ``subagent.spawned`` for a new child."""
    events.publish(
        SPAWNED,
        session_id=record.session_id,
        task_id=record.task_id,
        agent_path=record.agent_path,
        data={
            "agent": record.spec.name,
            "parent_path": record.parent_path,
            "mode": "execute" if record.sync else "spawn",
            "timeout_s": record.timeout,
        },
    )
