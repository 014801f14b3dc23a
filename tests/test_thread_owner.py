"""ThreadOwner: the first thread owns the object while it lives; others are refused by
name until it ends, then one may take over."""

from __future__ import annotations

import threading

import pytest

from subagents._thread_owner import ThreadOwner


def in_thread(owner: ThreadOwner, name: str, hold: threading.Event | None = None) -> list[str]:
    """Claim ``owner`` from a new thread called ``name`` (kept alive until ``hold`` is
    set, if given); what happened, once it has claimed or been refused."""
    outcome: list[str] = []
    claimed = threading.Event()

    def body() -> None:
        try:
            owner.claim()
            outcome.append("owner")
        except RuntimeError as exc:
            outcome.append(str(exc))
        claimed.set()
        if hold is not None:
            hold.wait()

    thread = threading.Thread(target=body, name=name)
    thread.start()
    claimed.wait()
    if hold is None:
        thread.join()
    return outcome


def test_the_owner_claims_again_and_again() -> None:
    owner = ThreadOwner("pool")
    owner.claim()
    owner.claim()


def test_another_thread_is_refused_by_name_while_the_owner_lives() -> None:
    owner = ThreadOwner("pool")
    hold = threading.Event()
    try:
        assert in_thread(owner, "first", hold) == ["owner"]
        with pytest.raises(RuntimeError) as refused:
            owner.claim()
    finally:
        hold.set()
    message = str(refused.value)
    assert "thread 'first'" in message
    assert f"thread {threading.current_thread().name!r} needs a pool of its own" in message


def test_a_thread_takes_over_once_the_owner_has_ended() -> None:
    owner = ThreadOwner("pool")
    assert in_thread(owner, "first") == ["owner"]
    assert in_thread(owner, "second") == ["owner"]
