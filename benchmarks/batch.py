"""``subagents batch run`` end to end: no-op agents at scale, and ``--command true`` against
``xargs -P`` (and GNU ``parallel``, when installed) in the same run.

    python benchmarks/batch.py            # 100,000 agents, 2,000 commands: about a minute
    python benchmarks/batch.py --quick    # tiny sizes: proves it runs (CI)
    python benchmarks/batch.py --agents 0 --repeat 3   # the commands only, median of 3

Each figure is one run of the real console script (``python -m subagents batch run``) in
a fresh directory (so a fresh store), ``--progress none``:

- ``agents``: N no-op items (``{"n": i}``) through ``--agent batch:NOOP`` (this file's
  spec) at ``-j 16``: wall time, items per second, and the peak RSS of the process minus
  the peak of a one-item run (the interpreter, the imports and the store's open), from
  ``wait4``'s ``ru_maxrss``. Targets: 100,000 items in <= 60 s, <= 200 MB growth.
- ``commands``: M items through ``--command true`` at ``-j 16``, and ``seq M | xargs -P 16
  -n 1 true`` (``parallel -j 16 true ::: ...`` too if it is on PATH). Per-item overhead is
  wall / M; for the batch also (wall - the one-item run's wall) / M, which leaves out the
  interpreter's start-up. The batch runs on asyncio, and on trio too when it is installed
  (``--backend trio``): on Python 3.11 asyncio waits for each child in a thread of its
  own, trio does not. The target is the batch's per-item cost at most xargs's. With
  ``--repeat N`` the rounds run back to back and the median of each figure ends the report
  (the per-item cost past start-up, beside xargs's of the same rounds).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from subagents import AgentSpec, Request, RunContext

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


async def _noop(request: Request, ctx: RunContext) -> str:
    return ""


NOOP = AgentSpec(name="noop", runner=_noop)
"""The benchmark's agent (``--agent batch:NOOP``, this directory on the path)."""


def _timed(argv: list[str], cwd: Path, stdin: bytes | None = None) -> tuple[float, int, int]:
    """Run ``argv``: (wall seconds, exit status, peak RSS in KiB)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(HERE), env.get("PYTHONPATH", "")])
    start = time.perf_counter()
    process = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    if stdin is not None:
        assert process.stdin is not None
        process.stdin.write(stdin)
        process.stdin.close()
    assert process.stderr is not None
    errors = process.stderr.read()
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        sys.stderr.write(errors.decode(errors="replace"))
    return wall, process.returncode, usage.ru_maxrss


def _batch(items: int, runner: list[str], jobs: int) -> tuple[float, int, int]:
    with tempfile.TemporaryDirectory() as where:
        directory = Path(where)
        (directory / "items.jsonl").write_text("".join(f'{{"n": {i}}}\n' for i in range(items)))
        argv = [
            sys.executable, "-m", "subagents", "batch", "run", "--input", "items.jsonl",
            "--out", "out.jsonl", "-j", str(jobs), "--progress", "none", *runner,
        ]  # fmt: skip
        result = _timed(argv, directory)
        written = (directory / "out.jsonl").read_bytes().count(b"\n")
        if written != items:
            raise SystemExit(f"batch wrote {written} lines for {items} items")
        return result


def agents(n: int) -> None:
    runner = ["--agent", "batch:NOOP"]
    _, _, base_rss = _batch(1, runner, 16)
    wall, status, rss = _batch(n, runner, 16)
    growth = (rss - base_rss) / 1024
    print(
        f"agents    {n:>7} no-op items, -j 16: {wall:6.1f} s, {n / wall:7.0f} items/s, "
        f"peak RSS {rss / 1024:.0f} MB (+{growth:.0f} MB over one item), exit {status}"
    )


def commands(m: int, backends: list[str], repeat: int) -> None:
    """``repeat`` rounds, each of every backend then xargs (then parallel) back to back, so
    each round's figures share the machine's load; then the median of each."""
    numbers = "".join(f"{i}\n" for i in range(m)).encode()
    parallel = shutil.which("parallel")
    figures: dict[str, list[float]] = {}
    for round_ in range(1, repeat + 1):
        for backend in backends:
            runner = ["--command", "true", "--backend", backend]
            base_wall, _, _ = _batch(1, runner, 16)
            wall, status, _ = _batch(m, runner, 16)
            past = (wall - base_wall) / m
            figures.setdefault(backend, []).append(past)
            print(
                f"commands  {m:>7} x true, -j 16, {backend:>7}: {wall:6.2f} s, "
                f"{wall / m * 1e6:6.0f} us/item ({past * 1e6:.0f} us/item past "
                f"its {base_wall:.2f} s start-up), exit {status}"
            )
        with tempfile.TemporaryDirectory() as where:
            x_wall, x_status, _ = _timed(
                ["xargs", "-P", "16", "-n", "1", "true"], Path(where), stdin=numbers
            )
            figures.setdefault("xargs -P 16", []).append(x_wall / m)
            print(
                f"{'':10}xargs -P 16 -n 1 true:          {x_wall:6.2f} s, "
                f"{x_wall / m * 1e6:6.0f} us/item, exit {x_status}"
            )
            if parallel is not None:
                p_wall, p_status, _ = _timed(
                    [parallel, "-j", "16", "true"], Path(where), stdin=numbers
                )
                figures.setdefault("parallel -j 16", []).append(p_wall / m)
                print(
                    f"{'':10}parallel -j 16 true:            {p_wall:6.2f} s, "
                    f"{p_wall / m * 1e6:6.0f} us/item, exit {p_status}"
                )
        print(f"          round {round_}, load average {os.getloadavg()[0]:.2f}")
    if parallel is None:
        print("          GNU parallel: not installed")
    if repeat > 1:
        medians = {name: statistics.median(values) for name, values in figures.items()}
        xargs = medians["xargs -P 16"]
        for name, value in medians.items():
            print(
                f"median of {repeat}: {name:>14} {value * 1e6:6.0f} us/item "
                f"({value / xargs:.2f}x xargs)"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=100_000, help="no-op items (100,000)")
    parser.add_argument("--commands", type=int, default=2_000, help="`true` items (2,000)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of the commands (1)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes")
    args = parser.parse_args()
    if args.quick:
        args.agents, args.commands = 500, 100
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores")
    if args.agents:
        agents(args.agents)
    backends = ["asyncio"] + (["trio"] if importlib.util.find_spec("trio") else [])
    if args.commands:
        commands(args.commands, backends, args.repeat)


if __name__ == "__main__":
    main()
