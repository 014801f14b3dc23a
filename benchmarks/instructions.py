"""Instructions per child under callgrind: a noise-free companion to ``run.py``'s timings.

    python benchmarks/instructions.py                  # W1 at limit 4: floor and subagents
    python benchmarks/instructions.py --limit 1024
    python benchmarks/instructions.py --impl subagents --sizes 2000,6000

Wall-clock figures on a shared 2-core machine move by 5-10 % between runs; instruction
counts from ``valgrind --tool=callgrind`` do not depend on what else the machine is doing.
Each implementation runs W1's fan-out (spawn N no-op children, collect every result) in a
fresh process at two sizes; the difference divided by the difference in N is the cost of
one more child, with interpreter start-up and imports cancelled out. The garbage
collector's share is the inclusive count of CPython's ``gc_collect_main``. Hash seed and
task ids are fixed; what still varies between runs (handles hash by address, clock
readings) moves the per-child count by about 1 %, against 5-10 % for wall time here. Takes
about a minute per implementation; needs valgrind (Debian's ``valgrind`` package), which
``.ci/run`` does not install: this is a tool for optimisation work, not part of CI.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(Path(__file__).resolve().parent))

_TOTAL = re.compile(r"^(?:summary|totals):\s*(\d+)", re.MULTILINE)
_GC = re.compile(r"^\s*([\d,]+)\s.*gcmodule\.c:gc_collect_main\s", re.MULTILINE)


def _child(impl: str, n: int, limit: int) -> None:
    import asyncio
    import os
    import random

    # Repeatable counts: task ids come from os.urandom, and a different set of ids lays
    # out the runtime's dicts differently (about 1 % of the count between runs).
    rng = random.Random(0)
    os.urandom = rng.randbytes

    import anyio
    import workloads as wl

    if impl == "asyncio":
        asyncio.run(wl.fanout_asyncio(n, limit))
    else:
        anyio.run(wl.FANOUT[impl], n, limit)


def _measure(impl: str, n: int, limit: int, out_dir: Path) -> tuple[int, int]:
    """(all instructions, the GC's) of one fresh process running the fan-out."""
    out = out_dir / f"{impl}-{n}-{limit}.callgrind"
    subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            sys.executable,
            __file__,
            "--child",
            impl,
            str(n),
            str(limit),
        ],
        check=True,
        capture_output=True,
        env={**os.environ, "PYTHONHASHSEED": "0"},  # repeatable str hashes, likewise
    )
    text = out.read_text()
    total = _TOTAL.search(text)
    if total is None:
        raise RuntimeError(f"no instruction total in {out}")
    annotated = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", str(out)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    gc = max((int(m.group(1).replace(",", "")) for m in _GC.finditer(annotated)), default=0)
    return int(total.group(1)), gc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", default="asyncio,subagents", help="comma-separated")
    parser.add_argument("--sizes", default="2000,12000", help="two N, comma-separated")
    parser.add_argument("--limit", type=int, default=4, help="concurrency limit (W1: 4, 1024)")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child[0], int(args.child[1]), int(args.child[2]))
        return 0
    if shutil.which("valgrind") is None or shutil.which("callgrind_annotate") is None:
        print("valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    small, large = (int(s) for s in args.sizes.split(","))
    impls = [i.strip() for i in args.impl.split(",") if i.strip()]
    print(f"# W1 fan-out, limit {args.limit}: instructions per child, N {small:,} -> {large:,}")
    print("| implementation | per child | GC per child | GC share | x first |")
    print("|---|---|---|---|---|")
    first: float | None = None
    with tempfile.TemporaryDirectory() as tmp:
        for impl in impls:
            total_s, gc_s = _measure(impl, small, args.limit, Path(tmp))
            total_l, gc_l = _measure(impl, large, args.limit, Path(tmp))
            per_child = (total_l - total_s) / (large - small)
            gc_child = (gc_l - gc_s) / (large - small)
            first = per_child if first is None else first
            print(
                f"| {impl} | {per_child:,.0f} | {gc_child:,.0f} | "
                f"{gc_child / per_child:.0%} | {per_child / first:.2f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
