"""ThreadOwner: while one thread's uses are in progress, another thread's use is refused
by name; once they end, any thread may use the object."""

from __future__ import annotations

import threading

import pytest

from subagents._thread_owner import ThreadOwner


def use_in_thread(owner: ThreadOwner, name: str) -> list[str]:
    """One use of ``owner`` from a new thread called ``name``, run to its end: what
    happened."""
    outcome: list[str] = []

    def body() -> None:
        try:
            with owner.using():
                outcome.append("used")
        except RuntimeError as exc:
            outcome.append(str(exc))

    thread = threading.Thread(target=body, name=name)
    thread.start()
    thread.join()
    return outcome


def test_uses_of_one_thread_nest_and_overlap() -> None:
    owner = ThreadOwner("pool")
    with owner.using(), owner.using():
        pass
    with owner.using():
        pass


def test_another_thread_is_refused_by_name_while_a_use_is_in_progress() -> None:
    owner = ThreadOwner("pool")
    with owner.using():
        with owner.using():
            pass
        [refused] = use_in_thread(owner, "second")  # still in the outer use
    assert f"in use by the event loop of thread {threading.current_thread().name!r}" in refused
    assert "thread 'second' needs a pool of its own" in refused


def test_any_thread_may_use_it_once_the_uses_have_ended() -> None:
    owner = ThreadOwner("pool")
    with owner.using():
        pass
    assert use_in_thread(owner, "second") == ["used"]
    with owner.using():  # the other thread holds nothing once its use has ended
        pass


def test_a_use_that_raises_ends_too() -> None:
    owner = ThreadOwner("pool")
    with pytest.raises(ValueError, match="boom"), owner.using():
        raise ValueError("boom")
    assert use_in_thread(owner, "second") == ["used"]
