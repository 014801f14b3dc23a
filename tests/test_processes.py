"""Process liveness by pid and start time (the store's recovery, batch status and the
room's ``who`` all ask it)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from subagents._processes import pid_running, process_start

needs_proc = pytest.mark.skipif(process_start(os.getpid()) is None, reason="needs /proc")


def test_this_process_runs_and_a_nonsense_pid_does_not() -> None:
    assert pid_running(os.getpid())
    assert not pid_running(0)
    assert not pid_running(-5)
    assert not pid_running(2**70)  # no OverflowError


@needs_proc
def test_a_start_time_that_differs_names_another_process() -> None:
    start = process_start(os.getpid())
    assert start is not None
    assert pid_running(os.getpid(), start)
    assert not pid_running(os.getpid(), start + 1)  # a reused pid is another process


@needs_proc
def test_an_ended_child_not_yet_reaped_has_ended() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # ended, still a zombie
        assert not pid_running(child.pid)
    finally:
        child.wait()
    assert not pid_running(child.pid)
