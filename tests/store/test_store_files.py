"""Opening what is not a store fails with a clear StoreError and changes nothing on disk:
garbage bytes, a truncated file, another program's SQLite database (plain or in WAL mode),
a newer schema (in the header, or only in the WAL), a read-only directory or file."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from subagents import ConfigError, SubagentsError
from subagents.store import APPLICATION_ID, SCHEMA_VERSION, SqliteStore, StoreError
from tests.store.support import env, foreign_wal_database, snapshot, sqlite

pytestmark = pytest.mark.anyio


async def refused(path: Path, reason: str) -> StoreError:
    """Opening ``path`` raises StoreError(reason) and leaves its directory as it was."""
    before = snapshot(path.parent)
    store = SqliteStore(path)
    with pytest.raises(StoreError) as info:
        async with store:
            pass
    assert info.value.reason == reason, info.value
    assert info.value.path == str(path)
    assert isinstance(info.value, SubagentsError)
    assert snapshot(path.parent) == before, "a refused open changed the directory"
    assert store.closed
    with pytest.raises(RuntimeError, match="opens once"):
        await store.__aenter__()
    return info.value


async def make_store(path: Path, entries: int = 0) -> None:
    async with SqliteStore(path) as store:
        box = store.mailbox("s", capacity=max(entries, 1))
        for i in range(entries):
            box.put(f"t{i}", env(f"t{i}", "x" * 500))
        await box.wait_committed()


async def test_garbage_bytes(tmp_path: Path) -> None:
    path = tmp_path / "garbage.db"
    path.write_bytes(os.urandom(4096))
    error = await refused(path, "not_sqlite")
    assert "not a SQLite database" in str(error)


async def test_a_file_too_short_for_a_header(tmp_path: Path) -> None:
    path = tmp_path / "short.db"
    path.write_bytes(b"SQLite format 3\x00" + b"\x00" * 20)
    await refused(path, "not_sqlite")


async def test_a_truncated_store(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    await make_store(path, entries=200)
    data = path.read_bytes()
    assert len(data) > 8 * 4096
    path.write_bytes(data[: 3 * 4096])
    error = await refused(path, "truncated")
    assert "declares" in str(error)


async def test_a_store_read_mid_checkpoint_is_read_again_not_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process's checkpoint writes the header's page first and the file grows as
    the later pages follow: a header read then declares more than the file holds, for a
    moment. Opening looks again instead of refusing the store as truncated."""
    import attrs

    from subagents.store import _files

    path = tmp_path / "store.db"
    await make_store(path, entries=200)
    real = _files.read_header
    reads: list[int] = []

    def mid_checkpoint(at: Path) -> _files.Header | None:
        header = real(at)
        reads.append(1)
        if len(reads) == 1 and header is not None:  # the first look: the file half written
            assert header.pages is not None
            return attrs.evolve(header, size=header.pages * header.page_size // 2)
        return header

    monkeypatch.setattr(_files, "read_header", mid_checkpoint)
    monkeypatch.setattr(_files, "_SETTLE_WAIT", 0.0)
    async with SqliteStore(path) as store:
        assert len(store.mailbox("s")) == 200
    assert len(reads) >= 2


async def test_another_programs_database(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite(path) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.execute("INSERT INTO notes VALUES ('mine')")
    error = await refused(path, "not_a_store")
    assert "application_id is 0x0" in str(error)


async def test_another_programs_database_in_wal_mode_while_it_has_it_open(tmp_path: Path) -> None:
    """With a live ``-wal`` the header on disk may be stale, so the check is SQLite's own,
    inside the transaction: it must refuse too, and write nothing."""
    path = tmp_path / "other.db"
    with foreign_wal_database(path) as conn:
        store = SqliteStore(path)
        with pytest.raises(StoreError) as info:
            async with store:
                pass
        assert info.value.reason == "not_a_store"
        tables = conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'").fetchall()
        assert tables == [("notes",)]
        assert conn.execute("PRAGMA application_id").fetchall() == [(0,)]


async def test_a_newer_schema(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    await make_store(path, entries=3)
    with sqlite(path) as conn:
        conn.execute("INSERT INTO schema_version VALUES (?, 0, 'from the future')", (99,))
        conn.execute("PRAGMA user_version = 99")
    error = await refused(path, "newer_schema")
    assert "schema version 99" in str(error)
    assert f"up to {SCHEMA_VERSION}" in str(error)


async def test_a_newer_schema_still_in_the_wal(tmp_path: Path) -> None:
    """A newer version's migration committed by a process that has not checkpointed: the
    main file's header still says this version; the schema table, read through the WAL,
    says the next."""
    path = tmp_path / "store.db"
    await make_store(path, entries=3)
    newer = SCHEMA_VERSION + 1
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        conn.execute("INSERT INTO schema_version VALUES (?, 0, 'newer')", (newer,))
        conn.execute(f"PRAGMA user_version = {newer}")
        with pytest.raises(StoreError) as info:
            async with SqliteStore(path):
                pass
        assert info.value.reason == "newer_schema"
        assert conn.execute("SELECT max(version) FROM schema_version").fetchall() == [(newer,)]
    finally:
        conn.close()


async def test_a_store_with_tables_but_no_version_is_not_a_store(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    with sqlite(path) as conn:
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute("CREATE TABLE deliveries (id INTEGER)")
    await refused(path, "not_a_store")


async def test_a_missing_directory_a_directory_and_an_empty_file(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="does not exist") as info:
        async with SqliteStore(tmp_path / "missing" / "store.db"):
            pass
    assert info.value.reason == "unwritable"
    assert not (tmp_path / "missing").exists()
    (tmp_path / "adir").mkdir()
    await refused(tmp_path / "adir", "unwritable")
    empty = tmp_path / "empty.db"
    empty.touch()  # an empty file is an empty database: it becomes a store
    async with SqliteStore(empty) as store:
        store.mailbox("s").put("a", env("a"))
    async with SqliteStore(empty) as store:
        assert store.mailbox("s").peek("a") == env("a")


OPEN_AS_NOBODY = """
import os, sys
sys.path.insert(0, sys.argv[2])
import anyio, anyio._backends._asyncio, asyncio  # everything, before giving up root
from subagents.store import SqliteStore, StoreError
if os.geteuid() == 0:
    os.setgid(65534)
    os.setuid(65534)
async def main():
    try:
        async with SqliteStore(sys.argv[1]):
            print("opened")
    except StoreError as exc:
        print(exc.reason)
anyio.run(main)
"""


def open_without_privileges(path: Path) -> str:
    """Open ``path`` in a process that cannot override file permissions (root drops to
    ``nobody`` after importing, as the interpreter lives under /root); its answer."""
    root = str(Path(__file__).resolve().parents[2])
    done = subprocess.run(
        [sys.executable, "-c", OPEN_AS_NOBODY, str(path), root],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory ``nobody`` may enter (pytest's own temp root is private to its user)."""
    base = Path(tempfile.mkdtemp(prefix="store-ro-"))
    base.chmod(0o755)
    yield base
    for directory in [base, *base.rglob("*")]:
        if directory.is_dir():
            directory.chmod(0o755)
    shutil.rmtree(base)


def test_a_read_only_directory(shared_dir: Path) -> None:
    directory = shared_dir / "ro"
    directory.mkdir(mode=0o755)
    anyio.run(make_store, directory / "store.db", 3)
    (directory / "store.db").chmod(0o666)
    directory.chmod(0o555)
    before = snapshot(directory)
    assert open_without_privileges(directory / "store.db") == "unwritable"
    assert open_without_privileges(directory / "new.db") == "unwritable"
    assert snapshot(directory) == before


def test_a_read_only_file(shared_dir: Path) -> None:
    anyio.run(make_store, shared_dir / "store.db", 3)
    (shared_dir / "store.db").chmod(0o444)
    shared_dir.chmod(0o777)
    before = snapshot(shared_dir)
    assert open_without_privileges(shared_dir / "store.db") == "unwritable"
    assert snapshot(shared_dir) == before


@pytest.mark.parametrize(
    "kwargs",
    [
        {"synchronous": "full"},
        {"synchronous": "OFF"},
        {"busy_timeout": 0},
        {"busy_timeout": -1.0},
        {"poll_interval": float("nan")},
    ],
)
def test_bad_arguments_are_config_errors(tmp_path: Path, kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        SqliteStore(tmp_path / "store.db", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        SqliteStore("")
    with pytest.raises(ConfigError):
        SqliteStore(42)  # type: ignore[arg-type]
    assert not list(tmp_path.iterdir())


async def test_an_old_sqlite_is_refused_before_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 31, 1))
    error = await refused(tmp_path / "store.db", "failed")
    assert "needs SQLite 3.38.0 or newer" in str(error)
    assert not (tmp_path / "store.db").exists()
