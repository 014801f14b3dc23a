"""Make README's picture of a run: docs/timeline.png.

Records a small run's event log (``subagents demo --events``), draws its timeline
(``subagents events timeline``) and screenshots the page in headless Chromium (Debian's
``chromium`` package), with the hover summary of the failed agent open. Also prints the
run's ``subagents events tree``, which README shows beside it.

    python scripts/timeline_screenshot.py [--output docs/timeline.png] [--chromium PATH]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WIDTH = 1200
# The page's fixed parts (title, summary, legend, axis) and each row, in CSS pixels.
HEAD_PX, ROW_PX, FOOT_PX = 150, 21, 24
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


def subagents(*args: str) -> str:
    """Run the ``subagents`` command line of this checkout; returns its output."""
    done = subprocess.run(
        [sys.executable, "-m", "subagents", *args],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return done.stdout


def failed_task(log: Path) -> str:
    """The id of the first task the log says failed with an error."""
    for line in log.read_text(encoding="utf-8").splitlines():
        event = json.loads(line)
        if event["type"] == "subagent.completed" and event["data"]["status"] == "error":
            return str(event["task_id"])
    raise SystemExit(f"{log}: no failed task to show")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "timeline.png")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        log, page = Path(work) / "events.jsonl", Path(work) / "run.html"
        subagents("demo", "--events", str(log))
        tree = subagents("events", "tree", str(log), "--color=never")
        subagents("events", "timeline", str(log), "-o", str(page))
        rows = len(tree.splitlines()) - 2  # the tree's lines but its headline and blank line
        height = HEAD_PX + ROW_PX * rows + FOOT_PX
        args.output.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                args.chromium,
                *FLAGS,
                f"--user-data-dir={Path(work) / 'profile'}",
                f"--window-size={WIDTH},{height}",
                f"--screenshot={args.output}",
                f"{page.as_uri()}#task-{failed_task(log)}",
            ],
            capture_output=True,
            check=True,
        )
    print(tree, end="")
    print(f"wrote {args.output} ({args.output.stat().st_size} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
