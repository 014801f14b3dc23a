"""Who an address names, and who a sender's peers are.

An agent's address is its task id; a host session's is its session id. An address may
also be an agent path: absolute (``/root/planner/coder``, in the sender's own tree) or
relative (``coder``: below the sender first, then below the tree's root). ``"*"`` and
``"all"`` name every live agent of the sender's tree but the sender. Every lookup walks
one path or one tree, never every record of the manager.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from time import perf_counter
from typing import TYPE_CHECKING, Final

from ._envelope import now_ms
from ._errors import UnknownPeer
from ._messages import PeerInfo, PeerState
from ._paths import AgentPath
from ._record import QUEUED, SETTLED, ChildRecord

if TYPE_CHECKING:
    from ._router import Postbox
    from ._sessions import Sessions

__all__ = ["MAX_PEERS", "HOST_AGENT", "Peer", "Peers"]

MAX_PEERS: Final = 1000
"""Agents one listing (or one broadcast) reaches at most, nearest the root first."""
HOST_AGENT: Final = "host"
"""The agent type a host session is listed as."""
_ROOT_PATH: Final = AgentPath.root()


class Peer:
    """A resolved address: a child's record, or a host session (``record is None``)."""

    __slots__ = ("address", "record", "root")

    def __init__(self, address: str, record: ChildRecord | None, root: str) -> None:
        self.address = address
        self.record = record
        self.root = root  # the root session of its tree

    @property
    def path(self) -> AgentPath:
        return _ROOT_PATH if self.record is None else self.record.agent_path

    @property
    def ended(self) -> bool:
        return self.record is not None and self.record.state == SETTLED


class Peers:
    """Address resolution and listings over the sessions' index."""

    def __init__(self, sessions: Sessions, postbox: Postbox) -> None:
        self._sessions = sessions
        self._postbox = postbox

    def of(self, address: str) -> Peer:
        """The peer of a sender's own ``address`` (a task id, else a host session)."""
        record = self._sessions.get(address)
        if record is not None:
            return Peer(address, record, record.root_session)
        return Peer(address, None, address)

    def resolve(self, sender: Peer, to: str) -> Peer:
        """The peer ``to`` names for ``sender``; raises :class:`UnknownPeer` naming the
        addresses probably meant."""
        # Only the sender's own tree: another session's agents and host are as unknown
        # to it as they are to its listings and waits.
        record = self._sessions.find(to)
        if record is not None and record.root_session == sender.root:
            return Peer(to, record, sender.root)
        if to == sender.root:
            return Peer(to, None, to)
        for path in self._candidates(sender, to):
            found = self._by_path(sender.root, path)
            if found is not None:
                return found
        raise UnknownPeer(to, self._suggestions(sender, to))

    @staticmethod
    def _candidates(sender: Peer, to: str) -> list[str]:
        if to.startswith("/"):
            return [to.rstrip("/") or to]
        rel = to.strip("/")
        if not rel:
            return []
        return [f"{sender.path}/{rel}", f"{_ROOT_PATH}/{rel}"]

    def _by_path(self, root: str, path: str) -> Peer | None:
        segments = path.split("/")[1:]
        if not segments or segments[0] != _ROOT_PATH.name:
            return None
        if len(segments) == 1:
            return Peer(root, None, root)
        session, found = root, None
        for segment in segments[1:]:
            found = None
            for record in reversed(self._sessions.listing(session)):
                if record.agent_path.name == segment:
                    found = record
                    break
            if found is None:
                return None
            session = found.task_id
        assert found is not None
        return Peer(found.task_id, found, root)

    def _suggestions(self, sender: Peer, to: str) -> list[str]:
        # Each peer by its id, its path and its name, each leading to what to send to.
        known: dict[str, str] = {}
        for peer in self.tree(sender.root, live_only=False):
            path = str(peer.path)
            known.setdefault(peer.address, peer.address)
            known.setdefault(path, path)
            known.setdefault(peer.path.name, path)
        close = difflib.get_close_matches(to[:200], list(known), n=3, cutoff=0.5)
        return list(dict.fromkeys(known[c] for c in close))

    def tree(self, root: str, *, live_only: bool) -> Iterator[Peer]:
        """The host of ``root`` and its tree's agents, breadth first, at most
        :data:`MAX_PEERS` (``live_only``: queued or running ones)."""
        yield Peer(root, None, root)
        sessions, seen = [root], 1
        while sessions and seen < MAX_PEERS:
            session = sessions.pop(0)
            if live_only:
                live = self._sessions.live(session)
                records = list(live) if live else []
            else:
                records = self._sessions.listing(session)
            for record in records:
                if seen >= MAX_PEERS:
                    return
                seen += 1
                yield Peer(record.task_id, record, root)
                sessions.append(record.task_id)

    def live_count(self, root: str) -> int:
        """How many queued or running agents the tree of ``root`` has, with no cap: only
        a broadcast that reached :data:`MAX_PEERS` asks, to say whom it left out."""
        sessions, count = [root], 0
        while sessions:
            live = self._sessions.live(sessions.pop())
            if live:
                count += len(live)
                sessions.extend(record.task_id for record in live)
        return count

    def info(self, peer: Peer) -> PeerInfo:
        """What :meth:`SubagentManager.peers` says of ``peer``."""
        postbox, record = self._postbox, peer.record
        waiting = postbox.waiting(peer.address) > 0
        last = postbox.last_activity(peer.address) or 0
        state: PeerState
        if record is None:
            closed = self._sessions.is_closed(peer.address)
            state = "ended" if closed else ("idle" if waiting else "running")
            agent = HOST_AGENT
        else:
            agent = record.spec.name
            if record.envelope is not None:
                state = "ended"
                last = max(last, record.envelope.timestamp_ms)
            else:
                state = "queued" if record.state == QUEUED else ("idle" if waiting else "running")
                since = record.spawned_at if record.started_at is None else record.started_at
                last = max(last, now_ms() - int((perf_counter() - since) * 1000))
        return PeerInfo(
            id=peer.address,
            agent_path=str(peer.path),
            agent=agent,
            state=state,
            unread=postbox.unread(peer.address),
            last_activity_ms=last or now_ms(),
        )
