"""The examples run and print what they promise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_example(name: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_agent_loop_example() -> None:
    out = run_example("agent_loop.py")
    for topic in ("anyio", "trio", "asyncio"):
        assert f"/root/{topic} [completed] notes on '{topic}'" in out
    assert "collected 3 results" in out
