"""Helpers of the batch tests: the real console script in a subprocess, inputs, results."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import suppress
from pathlib import Path

import anyio

from subagents.backends.command import CommandRunner

ROOT = Path(__file__).resolve().parents[2]
"""The source tree: first on the subprocess's path, so its code is what runs."""


def environment(runs: Path | None = None, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.pop("CI", None)
    if runs is not None:
        env["BATCH_RUNS"] = str(runs)
    env.update(extra)
    return env


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "subagents", "batch", *args]


def batch(
    *args: str,
    cwd: Path,
    runs: Path | None = None,
    stdin: str | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """``subagents batch ARGS`` in ``cwd``, to its end."""
    return subprocess.run(
        command(*args),
        cwd=cwd,
        env=environment(runs),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start(*args: str, cwd: Path, runs: Path | None = None) -> subprocess.Popen[str]:
    """``subagents batch ARGS`` in ``cwd``, started (stderr piped, stdout discarded)."""
    return subprocess.Popen(
        command(*args),
        cwd=cwd,
        env=environment(runs),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def write_jsonl(path: Path, items: Iterable[Mapping[str, object]]) -> Path:
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return path


def results(path: Path) -> list[dict[str, object]]:
    """Every line of a results file, parsed: a line that does not parse fails the test."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def by_id(path: Path) -> dict[str, dict[str, object]]:
    """The envelopes of a results file by id; an id written twice fails the test."""
    found: dict[str, dict[str, object]] = {}
    for line in results(path):
        item_id = line["id"]
        assert isinstance(item_id, str)
        assert item_id not in found, f"{item_id} written twice"
        envelope = line["envelope"]
        assert isinstance(envelope, dict)
        found[item_id] = envelope
    return found


def lines_of(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def runs_of(path: Path) -> list[str]:
    """The ids the test agents recorded as they started, in order."""
    try:
        return path.read_text().split()
    except FileNotFoundError:
        return []


def wait_until(done: object, what: str, timeout: float = 30.0) -> None:
    """Poll ``done()`` (a file's state) until it holds; fail after ``timeout`` seconds."""
    assert callable(done)
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def alive(pids: Sequence[int]) -> list[int]:
    """The pids still running (a zombie no parent reaped yet counts as ended)."""
    living = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            continue
        if state not in ("Z", "X"):
            living.append(pid)
    return living


def wait_ended(pids: Sequence[int], timeout: float = 10.0) -> None:
    """Wait until none of ``pids`` runs. SIGKILL returns before its target has died, and
    an orphan's end is its own (only its parent, gone, could have waited for it): so the
    test waits on /proc for what the kernel is finishing, and fails on what it is not."""
    wait_until(lambda: not alive(pids), f"the end of {alive(pids)}", timeout)


class ScopedRun:
    """A run of ``runner`` (its template with no fields) in a cancel scope of its own:
    start :meth:`run` in a task, :meth:`cancel` it, and :attr:`returned` is set once the
    run has returned."""

    def __init__(self, runner: CommandRunner) -> None:
        self.runner = runner
        self.scope = anyio.CancelScope()
        self.returned = anyio.Event()

    async def run(self) -> None:
        with self.scope:
            await self.runner.run(self.runner.argv({}), b"")
        self.returned.set()

    def cancel(self) -> None:
        self.scope.cancel()

    async def cancel_and_wait(self, bound: float) -> None:
        """Cancel the run, then wait up to ``bound`` seconds (which bounds a failure
        only) for it to return: the caller asserts :attr:`returned`."""
        self.cancel()
        with anyio.move_on_after(bound):
            await self.returned.wait()


def pipe_holder(pid_file: Path) -> str:
    """A shell fragment that starts, in the background, a descendant in a session of its
    own that holds the command's stdout for 30 s. It writes its pid to ``pid_file`` once
    it is in its new session: written before, the group's kill could still reach it, and
    nothing would hold the pipe."""
    held = f"echo $$ > {pid_file}.tmp && mv {pid_file}.tmp {pid_file} && exec sleep 30"
    return f"setsid sh -c '{held}' &"


def kill_pipe_holder(pid_file: Path) -> None:
    """End what :func:`pipe_holder` started, if it did start (and has not ended)."""
    if pid_file.exists():
        with suppress(ProcessLookupError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
