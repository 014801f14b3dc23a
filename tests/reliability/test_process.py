"""Process level: a chaos scenario under ``python -X dev -W error`` with asyncio debug mode
leaves no destroyed-pending tasks, unawaited coroutines or unretrieved exceptions."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .chaos import SEED

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
FORBIDDEN = (
    "Task was destroyed but it is pending",
    "was never awaited",
    "exception was never retrieved",
    "Task exception was never retrieved",
    "Future exception was never retrieved",
    "Exception ignored",
    "ResourceWarning",
    "RuntimeWarning",
    "Traceback",
)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_chaos_under_dev_mode_leaves_no_warnings(backend: str) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(TESTS)])
    env["PYTHONASYNCIODEBUG"] = "1"
    env["PYTHONDEVMODE"] = "1"
    command = [sys.executable, "-X", "dev", "-W", "error", "-m", "reliability.scenario"]
    command += ["--backend", backend, "--spawns", "500", "--seed", str(SEED)]
    proc = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    stderr = proc.stderr
    assert proc.returncode == 0, (SEED, proc.returncode, stderr[-4000:])
    found = [marker for marker in FORBIDDEN if marker in stderr]
    assert not found, (SEED, found, stderr[-4000:])
    assert "spawns in" in proc.stdout, proc.stdout
