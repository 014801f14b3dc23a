"""The batch tests' fixtures: the command runner's two ways of starting a process."""

from __future__ import annotations

import pytest

from subagents.backends import _spawn


@pytest.fixture(params=["pidfd", "open_process"])
def process_start(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs the test with the runner's processes started off the event loop and awaited
    through a pidfd (its path on Linux), then by ``anyio.open_process`` (its path where
    pidfds are missing): both must keep every promise of the runner."""
    if request.param == "pidfd":
        if not _spawn.AVAILABLE:
            pytest.skip("no pidfds on this platform")
    else:
        monkeypatch.setattr(_spawn, "AVAILABLE", False)
    return str(request.param)
