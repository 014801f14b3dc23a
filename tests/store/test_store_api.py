"""The public surface of ``subagents.store``: exact names, the module each object names,
the error's place in the tree, and a docstring on every public callable."""

from __future__ import annotations

import inspect

import pytest

import subagents
import subagents.store
from subagents.store import REASONS, StoreError

STORE = {
    "APPLICATION_ID", "DEFAULT_BUSY_TIMEOUT", "DEFAULT_POLL_INTERVAL", "INTERRUPTED",
    "REASONS", "SCHEMA_VERSION", "SqliteJournal", "SqliteMailbox", "SqliteStore",
    "StoreError", "StoreStatistics", "Synchronous",
}  # fmt: skip


def test_all_is_exactly_the_public_surface() -> None:
    assert len(subagents.store.__all__) == len(STORE)
    assert set(subagents.store.__all__) == STORE
    namespace: dict[str, object] = {}
    exec("from subagents.store import *", namespace)
    assert set(namespace) - {"__builtins__"} == STORE


def test_every_public_class_names_the_store_module_and_says_what_it_is() -> None:
    for name in subagents.store.__all__:
        obj = getattr(subagents.store, name)
        if inspect.isclass(obj):
            assert obj.__module__ == "subagents.store", name
            assert obj.__qualname__ == name
            assert (obj.__doc__ or "").strip(), name
            for attr, member in vars(obj).items():
                if not attr.startswith("_") and inspect.isfunction(member):
                    assert (member.__doc__ or "").strip() or attr in _DOCUMENTED_BY_BASE, (
                        f"{name}.{attr}"
                    )


# The BaseMailbox methods SqliteMailbox implements keep the interface's docstring.
_DOCUMENTED_BY_BASE = {
    "peek", "drain", "drain_all", "subscribe_once", "subscribe_all", "unsubscribe",
    "statistics",
}  # fmt: skip


def test_store_error_is_a_subagents_error_with_its_data() -> None:
    assert issubclass(StoreError, subagents.SubagentsError)
    error = StoreError("/x.db", "locked", "held for too long")
    assert (error.path, error.reason, error.detail) == ("/x.db", "locked", "held for too long")
    assert str(error) == "store '/x.db': held for too long"
    assert set(REASONS) == {
        "not_sqlite", "not_a_store", "truncated", "newer_schema", "unwritable", "locked",
        "corrupt", "failed",
    }  # fmt: skip
    with pytest.raises(ValueError, match="oops"):
        StoreError("/x.db", "oops", "")


def test_the_core_does_not_import_the_store() -> None:
    assert "subagents.store" not in subagents.__all__
    assert not hasattr(subagents, "SqliteStore")
