"""``subagents room who|history|leases|send --store PATH``."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from subagents._cli import main
from subagents._json import loads
from subagents.room import Room


def prepared(path: Path) -> tuple[str, str]:
    """A store with two members of room ``r`` (the first holding a lease on ``/tmp/x``)."""

    async def fill() -> tuple[str, str]:
        async with Room(path) as room:
            a = (await room.join("r", label="alice")).member_id
            b = (await room.join("r", label="bob", pid=None)).member_id
            await room.claim(a, "/tmp/x")
            return a, b

    return anyio.run(fill)


def test_send_who_history_and_leases(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(tmp_path / "s.db")
    a, b = prepared(tmp_path / "s.db")
    assert main(["room", "send", "--store", store, "--from", a, "--to", "*", "hello"]) == 0
    assert capsys.readouterr().out == "message 1 to 1 member(s)\n"
    assert main(["room", "who", "--store", store, "--room", "r", "--json"]) == 0
    members = [loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {m["member_id"]: m["liveness"] for m in members} == {a: "alive", b: "unknown"}  # type: ignore[index]
    assert main(["room", "history", "--store", store, "--room", "r"]) == 0
    out = capsys.readouterr().out
    assert "body=hello" in out
    assert f"from={a}" in out
    assert main(["room", "leases", "--store", store, "--member", a, "--json"]) == 0
    assert loads(capsys.readouterr().out)["path"] == "/tmp/x"  # type: ignore[index]
    assert main(["room", "leases", "--store", store, "--path", "/tmp/x"]) == 0
    assert f"member_id={a}" in capsys.readouterr().out
    assert main(["room", "send", "--store", store, "--from", b, "--to", a, "--json", "x"]) == 0
    assert loads(capsys.readouterr().out)["recipients"] == [a]  # type: ignore[index]


def test_failures_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(tmp_path / "s.db")
    assert main(["room", "who", "--store", store]) == 1
    assert capsys.readouterr().err == f"subagents room who: store {store!r}: no store here\n"
    a, _ = prepared(tmp_path / "s.db")
    assert main(["room", "send", "--store", store, "--from", a[:6], "--to", "*", "x"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("subagents room send: unknown member id")
    assert a in err
    assert err.count("\n") == 1


def test_the_cli_leases_of_a_member_reads_only(tmp_path: Path) -> None:
    """The command's docstring: ``who``, ``history`` and ``leases`` only read. Listing a
    ``notify`` member's leases must not move its stored message to ``accepted``."""
    store = tmp_path / "s.db"

    async def prepare() -> tuple[str, str]:
        async with Room(store) as room:
            sender = (await room.join("r")).member_id
            quiet = (await room.join("r", autonomy="notify")).member_id
            await room.send(sender, quiet, "x")
            return sender, quiet

    async def state(sender: str, quiet: str) -> str:
        async with Room(store) as room:
            (mine,) = await room.sent(sender)
            return mine.states[quiet]

    sender, quiet = anyio.run(prepare)
    assert main(["room", "leases", "--store", str(store), "--member", quiet]) == 0
    assert anyio.run(state, sender, quiet) == "stored"
