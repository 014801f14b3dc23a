"""A spawn's arguments checked and made into its record: the agent, the session, the
depth limit, options given once, the timeout that applies, the child's name and path,
its request and its permissions; and the record a spawn's idempotency key already
belongs to, if any."""

from __future__ import annotations

from collections.abc import Mapping
from time import perf_counter
from typing import Final

from ._envelope import clean_text
from ._errors import ConfigError, SpawnRejected, UnknownAgent
from ._events import SPAWNED, EventBus
from ._journal import Journal, KeyedTask, SpawnEntry, StoredTask
from ._json import JSONValue
from ._ledger import Ledger
from ._paths import AgentPath, child_path
from ._record import JOURNALED_BEFORE, SETTLED, ChildRecord
from ._sessions import Sessions
from ._spec import UNSET, AgentSpec, Request, SpawnOptions, SubagentConfig, _Unset
from ._validators import idempotency_key, seconds

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
        self.budgets = Ledger(sessions, config.max_children, config.max_agents)
        """The fan-out limits and budgets every spawn is checked against and charged to."""
        if journal is not None:
            sessions.restore = self.restore

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

    def held(self, agent: str, input: str, session_id: str, key: str | None) -> ChildRecord | None:
        """The record of the spawn that idempotency key ``key`` belongs to in
        ``session_id``, or ``None`` if it is free (or ``key`` is ``None``): a record kept
        here, else an ended task of another process, restored from the journal. Checks
        what :meth:`new_record` checks first, then the key.

        Raises:
            SpawnRejected: ``idempotency_conflict``: that spawn named another agent or
                input; ``idempotency_pending``: it is another process's and has not ended.
            ConfigError: a malformed key (or input or session id).
        """
        if key is None:
            return None
        self._check(agent, input, session_id)
        key = idempotency_key(key)
        record = self._sessions.keyed(session_id, key)
        if record is None and self._journal is not None:
            record = self._stored_holder(session_id, key)
        if record is not None and (record.request.agent, record.request.input) != (agent, input):
            raise _conflict(key, record, agent)
        return record

    def _stored_holder(self, session_id: str, key: str) -> ChildRecord | None:
        """The restored record of the ended task of another process holding ``key``."""
        assert self._journal is not None
        found = self._journal.by_key(session_id, key)
        if found is None:
            return None
        if not found.ended:
            raise _pending(key, found)
        record = self._sessions.find(found.task_id)
        if record is None:  # forgotten since the read (by another process): the key is free
            return None
        self._sessions.hold_key(record, key)
        return record

    def _check(self, agent: str, input: str, session_id: str) -> AgentSpec:
        """The agent type of a spawn, its manager running and its argument types checked."""
        if not self._sessions.accepting:
            raise SpawnRejected(
                "manager_closed",
                "the subagent manager is not running: enter it with `async with` first "
                "(or it was closed)",
            )
        spec = self.specs.get(agent)
        if spec is None:
            raise UnknownAgent(agent, self.specs)
        if not isinstance(input, str):
            raise ConfigError("input", "a string", input)
        if not isinstance(session_id, str):
            raise ConfigError("session_id", "a string", session_id)
        return spec

    def new_record(
        self,
        agent: str,
        input: str,
        session_id: str,
        name: str | None,
        timeout: float | _Unset | None,
        options: SpawnOptions | None,
        key: str | None,
        sync: bool,
    ) -> tuple[ChildRecord, ChildRecord | None]:
        """The record of a new child of ``session_id`` (and the record of the child owning
        that session, if any), checked in this order: the manager running, the agent, the
        input and session types, the key, the session open, the depth, the options, the
        timeout, the name. Raises the first problem found, before anything is recorded.
        ``key`` is an idempotency key :meth:`held` found free: the record holds it."""
        spec = self._check(agent, input, session_id)
        key = None if key is None else idempotency_key(key)
        parent = self._sessions.check_open(session_id)
        parent_path = _ROOT if parent is None else parent.agent_path
        if (1 if parent is None else parent_path.depth + 1) > self._config.max_depth:
            raise _depth_error(parent_path, self._config.max_depth)
        options = _NO_OPTIONS if options is None else _spawn_options(options, timeout, name)
        default = self._config.execute_timeout if sync else self._config.spawn_timeout
        timeout = _spawn_timeout(timeout, options, spec, default)
        budget = self.budgets.admit(session_id, parent, spec, options)
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
        record.idempotency_key = key
        self.budgets.opened(record, parent, budget)
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
        record.idempotency_key = entry.idempotency_key  # its key is its own again
        self.budgets.rerun(record, entry.request)
        self._sessions.add(record)
        return record


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
        # Texts as JSON can hold them: a lone surrogate (undecodable bytes smuggled into a
        # str) is replaced, so the store's row never fails its batch.
        request={
            "input": clean_text(request.input),
            "prompt": None if request.prompt is None else clean_text(request.prompt),
            "model": None if request.model is None else clean_text(request.model),
            "files": [clean_text(f) for f in request.files],
            "timeout": record.timeout,
            **_budget_of(record),
        },
        idempotency_key=record.idempotency_key,
    )


def _budget_of(record: ChildRecord) -> dict[str, JSONValue]:
    """The budget a spawn holds, as its journaled request keeps it (for a re-run)."""
    account = record.account
    return {} if account is None or account.limit is None else {"budget": account.limit.to_dict()}


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


def _conflict(key: str, record: ChildRecord, agent: str) -> SpawnRejected:
    """The error for a repeat of ``key`` naming another agent or input than its spawn."""
    held = record.request.agent
    what = f"agent {held!r}, not {agent!r}" if held != agent else "another input"
    return SpawnRejected(
        "idempotency_conflict",
        f"idempotency_key {key!r} already belongs to task {record.task_id!r} of session "
        f"{record.session_id!r}, spawned with {what}: a repeat names the same agent and "
        "input, and a different task needs a key of its own",
        task_id=record.task_id,
    )


def _pending(key: str, found: KeyedTask) -> SpawnRejected:
    """The error for a key held by a task another process journaled and has not ended."""
    where = (
        "another process is running it; once it has ended, a repeat returns its envelope"
        if found.owner_alive
        else "its process is gone: entering a manager on this store gives it its "
        "Interrupted envelope, which a repeat then returns"
    )
    return SpawnRejected(
        "idempotency_pending",
        f"idempotency_key {key!r} already belongs to task {found.task_id!r}, which has not "
        f"ended: {where}",
        task_id=found.task_id,
    )


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
