"""Benchmark ``subagents`` against the raw-asyncio and raw-anyio floors (issue 5).

    python benchmarks/run.py                 # everything, about a minute and a half
    python benchmarks/run.py --quick         # tiny sizes: proves it still works (CI)
    python benchmarks/run.py -w W1,W3 -r 7   # some workloads, more repetitions

Each workload runs for ``subagents`` and for two floors written in ``workloads.py``, in the
same run: plain asyncio (create_task + Semaphore + futures) and plain anyio (task group +
CapacityLimiter + events). Repetitions are interleaved (floor, floor, subagents, rotated each
round) and the table shows medians; the garbage collector stays on. Timings run in this
process; memory figures and the W5/W6 runs each run in a fresh subprocess, so one peak
cannot hide another and process-global state (a tracer provider) cannot leak between them.
Memory is resident-set size from /proc/self/status (VmRSS, VmHWM), not tracemalloc: it
counts everything the interpreter really holds (allocator slack included) and, at 10,000
agents and more, page granularity is far below the figures measured.

One JSON line per figure (plus a header line describing the machine) goes to ``--out``
(default ``benchmarks/results/bench-<UTC time>.jsonl``).
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from time import perf_counter
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Measure the checkout this file is in, not whatever `subagents` is installed.
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(Path(__file__).resolve().parent))

import anyio  # noqa: E402
import messaging as w8  # noqa: E402
import workloads as wl  # noqa: E402

import subagents  # noqa: E402

IMPLS = wl.IMPLS
WORKLOADS = ("W1", "W2", "W3", "W4", "W5", "W6", "W7", "W8")

FULL: dict[str, Any] = {
    "reps": 5,
    "mem_reps": 3,
    "w1_n": 10_000,
    "w1_limits": (4, 1024),
    "w2_n": 2_000,
    "w2_limit": 64,
    "w2_sleep": 0.010,
    "w3_samples": 2_000,
    "w3_limit": 4,
    "w4_depth": 3,
    "w4_fanout": 8,
    "w4_limit": 1024,
    "w5_sizes": (10_000, 100_000),
    "w5_limit": 4,
    "w5_reps": 2,
    "w6_n": 10_000,
    "w6_limit": 4,
    "w6_reps": 3,
    "w6_repeat": 3,
    "w7_batches": 10,
    "w7_n": 10_000,
    "w7_limit": 4,
    "w7_reps": 2,
    "w8_n": 5_000,
}
QUICK: dict[str, Any] = {
    "reps": 1,
    "mem_reps": 1,
    "w1_n": 300,
    "w1_limits": (4, 64),
    "w2_n": 64,
    "w2_limit": 16,
    "w2_sleep": 0.002,
    "w3_samples": 50,
    "w3_limit": 4,
    "w4_depth": 2,
    "w4_fanout": 4,
    "w4_limit": 64,
    "w5_sizes": (300, 1_500),
    "w5_limit": 4,
    "w5_reps": 1,
    "w6_n": 300,
    "w6_limit": 4,
    "w6_reps": 1,
    "w6_repeat": 1,
    "w7_batches": 3,
    "w7_n": 300,
    "w7_limit": 4,
    "w7_reps": 1,
    "w8_n": 200,
}


# --------------------------------------------------------------------------- memory probes


def _status_kb(field: str) -> int:
    """VmRSS / VmHWM in KB from /proc; elsewhere the peak RSS from getrusage for both."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if sys.platform == "darwin" else peak


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False if not permitted."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


# --------------------------------------------------------------------------- child process


def _tracing_variant(variant: str) -> dict[str, Any] | None:
    """Manager/config arguments for a W6 variant, or None if this build cannot express it.

    ``nosdk``: opentelemetry-api only, no provider installed (the API's no-op tracer).
    ``sdk``: an SDK ``TracerProvider`` whose only span processor does nothing.
    ``disabled``: tracing switched off by configuration, if ``SubagentConfig`` has a switch.
    """
    if variant == "nosdk":
        return {}
    if variant == "sdk":
        try:
            from opentelemetry import trace
            from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
        except ImportError:  # the SDK is a test extra: without it this variant is n/a
            return None

        class NoopProcessor(SpanProcessor):
            pass

        provider = TracerProvider()
        provider.add_span_processor(NoopProcessor())
        trace.set_tracer_provider(provider)
        params = inspect.signature(subagents.SubagentManager).parameters
        for name in ("tracer_provider", "tracer"):
            if name in params:
                value = provider if name == "tracer_provider" else provider.get_tracer("bench")
                return {"manager_extra": {name: value}}
        return {}
    if variant == "disabled":
        switch = tracing_switch()
        return None if switch is None else {switch: False}
    raise ValueError(variant)


def tracing_switch() -> str | None:
    """The name of a boolean tracing switch on ``SubagentConfig``, if there is one."""
    import attrs

    for field in attrs.fields(subagents.SubagentConfig):
        if "trac" in field.name and isinstance(field.default, bool):
            return field.name
    return None


def sustained_main(spec: dict[str, Any]) -> None:
    """W7 in this fresh process: wall time, peak RSS growth and records kept, one JSON line."""
    batches, n, limit, variant = spec["batches"], spec["n"], spec["limit"], spec["variant"]
    if variant == "asyncio":
        import asyncio

        def once(count: int) -> int:
            return asyncio.run(wl.sustained_asyncio(batches, count, limit))

    else:
        config: dict[str, Any] = {} if variant == "keep" else {"retain_collected": 0}

        async def body(count: int) -> int:
            return await wl.sustained_subagents(batches, count, limit, **config)

        def once(count: int) -> int:
            return anyio.run(body, count, backend=spec["backend"])  # type: ignore[no-any-return]

    once(min(n, 200))  # warm up
    gc.collect()
    base_kb = _status_kb("VmRSS")
    _reset_peak()
    t0 = perf_counter()
    kept = once(n)
    wall = perf_counter() - t0
    peak_kb = _status_kb("VmHWM")
    print(json.dumps({"wall": wall, "peak_growth_kb": peak_kb - base_kb, "kept": kept}))


def child_main(spec: dict[str, Any]) -> None:
    """Run one fan-out in this fresh process and print its figures as one JSON line."""
    if spec.get("kind") == "sustained":
        sustained_main(spec)
        return
    impl, n, limit, backend = spec["impl"], spec["n"], spec["limit"], spec["backend"]
    config: dict[str, Any] = {}
    if "variant" in spec:
        variant_config = _tracing_variant(spec["variant"])
        if variant_config is None:
            print(json.dumps({"na": True}))
            return
        config = variant_config
    fn = wl.FANOUT[impl]
    extra = (config,) if impl == "subagents" and config else ()

    async def body(count: int, marks: dict[str, float]) -> list[float]:
        def on_queued() -> None:
            marks["queued_kb"] = _status_kb("VmRSS")
            marks["queued_at"] = perf_counter()

        t0 = marks["t0"] = perf_counter()
        if extra:
            split = await fn(count, limit, on_queued, **extra[0])
        else:
            split = await fn(count, limit, on_queued)
        marks["wall"] = perf_counter() - t0
        return split  # type: ignore[no-any-return]

    def once(count: int, marks: dict[str, float]) -> list[float]:
        if impl == "asyncio":
            import asyncio

            return asyncio.run(body(count, marks))
        return anyio.run(body, count, marks, backend=backend)  # type: ignore[no-any-return]

    once(min(n, 200), {})  # warm up code paths and the allocator
    gc.collect()
    base_kb = _status_kb("VmRSS")
    peak_reset = _reset_peak()
    marks: dict[str, float] = {}
    split = once(n, marks)
    peak_kb = _status_kb("VmHWM")
    walls = [marks["wall"]]
    for _ in range(spec.get("repeat", 1) - 1):  # timing only: memory is from the first run
        gc.collect()
        again: dict[str, float] = {}
        once(n, again)
        walls.append(again["wall"])
    print(
        json.dumps(
            {
                "wall": statistics.median(walls),
                "walls": walls,
                "spawn_split": split,
                "drain": marks["t0"] + marks["wall"] - marks["queued_at"],
                "base_kb": base_kb,
                "queued_kb": marks["queued_kb"],
                "peak_kb": peak_kb,
                "peak_reset": peak_reset,
            }
        )
    )


def in_child(spec: dict[str, Any]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


# --------------------------------------------------------------------------- the runner


def interleaved(
    reps: int, names: tuple[str, ...], measure: Callable[[str], Any]
) -> dict[str, list[Any]]:
    """Run ``measure(name)`` ``reps`` times per name, one of each per round, the order
    rotated each round (so no variant always runs first, or just after another), with a
    garbage collection before each."""
    out: dict[str, list[Any]] = {name: [] for name in names}
    for rep in range(reps):
        first = rep % len(names)
        for name in names[first:] + names[:first]:
            gc.collect()
            out[name].append(measure(name))
    return out


class Bench:
    def __init__(self, size: dict[str, Any], backend: str, reps: int | None) -> None:
        self.size = dict(size)
        if reps is not None:
            self.size["reps"] = reps
        self.backend = backend
        self.rows: list[dict[str, Any]] = []

    # helpers -------------------------------------------------------------

    def _rounds(self, reps: int, measure: Callable[[str], Any]) -> dict[str, list[Any]]:
        """Run ``measure(impl)`` ``reps`` times per impl, interleaved and rotated."""
        return interleaved(reps, IMPLS, measure)

    def _timed(self, impl: str, fn: Callable[..., Any], *args: Any) -> float:
        return wl.timed(impl, fn, *args, backend=self.backend)

    def add(
        self,
        workload: str,
        figure: str,
        unit: str,
        samples: dict[str, list[float]],
        *,
        target: str = "",
        better: str = "lower",
        limit: float | None = None,
        absolute: bool = False,
        note: str = "",
    ) -> dict[str, Any]:
        values = {k: statistics.median(v) for k, v in samples.items() if v}
        row: dict[str, Any] = {
            "workload": workload,
            "figure": figure,
            "unit": unit,
            "median": values,
            "samples": samples,
            "target": target,
            "better": better,
            "note": note,
        }
        sub = values.get("subagents")
        for floor in ("asyncio", "anyio"):
            if sub is not None and values.get(floor):
                row[f"x_{floor}"] = sub / values[floor]
        if limit is not None and sub is not None:
            # The target is on the ratio to the asyncio floor, or on the figure itself.
            measured = sub if absolute else row.get("x_asyncio")
            if measured is not None:
                row["meets_target"] = measured <= limit if better == "lower" else measured >= limit
        self.rows.append(row)
        return row

    # workloads -----------------------------------------------------------

    def w1(self) -> None:
        s = self.size
        n = s["w1_n"]
        for limit in s["w1_limits"]:
            walls = self._rounds(
                s["reps"], lambda impl, limit=limit: self._timed(impl, wl.FANOUT[impl], n, limit)
            )
            us = {k: [w / n * 1e6 for w in v] for k, v in walls.items()}
            target = "<= 2.0x" if limit == 4 else "<= 2.5x"
            self.add(
                "W1",
                f"fan-out {n:,}, limit {limit:,}: us/agent",
                "us",
                us,
                target=target,
                limit=2.0 if limit == 4 else 2.5,
            )
            mem = self._rounds(s["mem_reps"], lambda impl, limit=limit: self._mem(impl, n, limit))
            self.add(
                "W1",
                f"fan-out {n:,}, limit {limit:,}: KB/queued agent",
                "KB",
                {k: [m["queued_kb"] for m in v] for k, v in mem.items()},
                target="<= 1.5x" if limit == 4 else "",
                limit=1.5 if limit == 4 else None,
                note="RSS growth when all are spawned, before any ran (fresh process)",
            )
            self.add(
                "W1",
                f"fan-out {n:,}, limit {limit:,}: KB/agent peak",
                "KB",
                {k: [m["peak_kb"] for m in v] for k, v in mem.items()},
                note="peak RSS growth over the whole run / N (fresh process)",
            )

    def _mem(self, impl: str, n: int, limit: int, **more: Any) -> dict[str, Any]:
        spec = {"impl": impl, "n": n, "limit": limit, "backend": self.backend, **more}
        r = in_child(spec)
        if r.get("na"):
            return r
        r["queued_kb"] = (r["queued_kb"] - r["base_kb"]) / n
        r["peak_kb"] = (r["peak_kb"] - r["base_kb"]) / n
        return r

    def w2(self) -> None:
        s = self.size
        n, limit, sleep = s["w2_n"], s["w2_limit"], s["w2_sleep"]
        ideal = n * sleep / limit
        walls = self._rounds(
            s["reps"], lambda impl: self._timed(impl, wl.IO[impl], n, limit, sleep)
        )
        self.add(
            "W2",
            f"I/O-bound {n:,} x {sleep * 1000:g} ms, limit {limit}: efficiency",
            "",
            {k: [ideal / w for w in v] for k, v in walls.items()},
            target=">= 0.95x",
            better="higher",
            limit=0.95,
        )

    def w3(self) -> None:
        s = self.size
        samples, limit = s["w3_samples"], s["w3_limit"]
        raw = self._rounds(
            s["reps"],
            lambda impl: wl.run(impl, wl.WAKE[impl], samples, limit, backend=self.backend),
        )
        mailbox = [
            wl.run("subagents", wl.wake_subagents_mailbox, samples, limit, backend=self.backend)
            for _ in range(s["reps"])
        ]
        for q, name, lim in ((0.5, "p50", 2.0), (0.99, "p99", 3.0)):
            per_rep = {k: [_quantile(v, q) * 1e6 for v in reps] for k, reps in raw.items()}
            self.add(
                "W3",
                f"wake latency {name} (wait_result), {samples:,} samples",
                "us",
                per_rep,
                target=f"<= {lim:g}x",
                limit=lim,
            )
            floors = {k: v for k, v in per_rep.items() if k != "subagents"}
            floors["subagents"] = [_quantile(v, q) * 1e6 for v in mailbox]
            self.add(
                "W3",
                f"wake latency {name} (Mailbox.wait)",
                "us",
                floors,
                target=f"<= {lim:g}x",
                limit=lim,
            )

    def w4(self) -> None:
        s = self.size
        depth, fanout, limit = s["w4_depth"], s["w4_fanout"], s["w4_limit"]
        agents = sum(fanout**d for d in range(1, depth + 1))
        walls = self._rounds(
            s["reps"],
            lambda impl: self._timed(impl, wl.TREE[impl], depth, fanout, limit) * 1000,
        )
        self.add(
            "W4",
            f"tree depth {depth} x fan-out {fanout} ({agents} agents), limit {limit}: wall",
            "ms",
            walls,
            target="<= 3x",
            limit=3.0,
        )

    def w5(self) -> None:
        s = self.size
        limit = s["w5_limit"]
        sizes = s["w5_sizes"]
        runs: dict[int, dict[str, list[dict[str, Any]]]] = {}
        for n in sizes:
            runs[n] = self._rounds(s["w5_reps"], lambda impl, n=n: self._mem(impl, n, limit))
        small, big = sizes[0], sizes[-1]
        for n in sizes:
            r = runs[n]
            first = {k: [m["spawn_split"][0] / (n / 10) * 1e6 for m in v] for k, v in r.items()}
            last = {k: [m["spawn_split"][-1] / (n / 10) * 1e6 for m in v] for k, v in r.items()}
            self.add("W5", f"{n:,} queued, limit {limit}: spawn call, first 10%", "us", first)
            self.add(
                "W5",
                f"{n:,} queued, limit {limit}: spawn call, last 10%",
                "us",
                last,
                note="flat per call when close to the first 10%",
            )
            self.add(
                "W5",
                f"{n:,} queued, limit {limit}: drain",
                "ms",
                {k: [m["drain"] * 1000 for m in v] for k, v in r.items()},
            )
            self.add(
                "W5",
                f"{n:,} queued, limit {limit}: KB/queued spawn",
                "KB",
                {k: [m["queued_kb"] for m in v] for k, v in r.items()},
                target="<= 1.5 KB" if n == big else "",
                limit=1.5 if n == big else None,
                absolute=True,
            )
            self.add(
                "W5",
                f"{n:,} queued, limit {limit}: KB/agent peak",
                "KB",
                {k: [m["peak_kb"] for m in v] for k, v in r.items()},
            )
        growth = {
            k: [b["drain"] / a["drain"] for a, b in zip(runs[small][k], runs[big][k], strict=True)]
            for k in IMPLS
        }
        self.add(
            "W5",
            f"drain {big:,} / drain {small:,} (linear = {big // small})",
            "x",
            growth,
            target=f"<= {big * 1.1 / small:g}",
            limit=big * 1.1 / small,
            absolute=True,
        )
        spawn_growth = {
            k: [
                sum(b["spawn_split"]) / big / (sum(a["spawn_split"]) / small)
                for a, b in zip(runs[small][k], runs[big][k], strict=True)
            ]
            for k in IMPLS
        }
        self.add(
            "W5",
            f"spawn call at {big:,} / at {small:,} (O(1) = 1)",
            "x",
            spawn_growth,
        )

    def w6(self) -> None:
        s = self.size
        n, limit = s["w6_n"], s["w6_limit"]
        variants = ("disabled", "nosdk", "sdk")
        out: dict[str, list[float]] = {v: [] for v in variants}
        for rep in range(s["w6_reps"]):
            for variant in variants[rep % 3 :] + variants[: rep % 3]:
                r = in_child(
                    {
                        "impl": "subagents",
                        "n": n,
                        "limit": limit,
                        "backend": self.backend,
                        "variant": variant,
                        "repeat": s["w6_repeat"],
                    }
                )
                if not r.get("na"):
                    out[variant].extend(w / n * 1e6 for w in r["walls"])
        base = statistics.median(out["disabled"]) if out["disabled"] else None
        for variant, label in (
            ("disabled", "tracing disabled by config"),
            ("nosdk", "no SDK (API no-op tracer)"),
            ("sdk", "SDK provider, no-op processor"),
        ):
            row: dict[str, Any] = {
                "workload": "W6",
                "figure": f"fan-out {n:,}, limit {limit}, {label}: us/agent",
                "unit": "us",
                "median": {"subagents": statistics.median(out[variant])} if out[variant] else {},
                "samples": {"subagents": out[variant]},
                "target": "<= 1.10x disabled" if variant == "nosdk" else "",
                "better": "lower",
                "note": ""
                if out[variant]
                else (
                    "n/a: no tracing switch in SubagentConfig"
                    if variant == "disabled"
                    else "n/a: opentelemetry-sdk is not installed"
                ),
            }
            if base and out[variant]:
                row["x_disabled"] = statistics.median(out[variant]) / base
                if variant == "nosdk":
                    row["meets_target"] = row["x_disabled"] <= 1.10
            self.rows.append(row)

    def w7(self) -> None:
        s = self.size
        batches, n, limit = s["w7_batches"], s["w7_n"], s["w7_limit"]
        variants = ("asyncio", "keep", "retain0")
        out: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
        for rep in range(s["w7_reps"]):
            for variant in variants[rep % 3 :] + variants[: rep % 3]:
                out[variant].append(
                    in_child(
                        {
                            "kind": "sustained",
                            "variant": variant,
                            "batches": batches,
                            "n": n,
                            "limit": limit,
                            "backend": self.backend,
                        }
                    )
                )
        total = batches * n
        what = f"{batches} batches x {n:,} through one manager, limit {limit}"
        for variant, label in (
            ("keep", "retain_collected=None"),
            ("retain0", "retain_collected=0"),
        ):
            self.add(
                "W7",
                f"{what}, {label}: us/agent",
                "us",
                {
                    "asyncio": [r["wall"] / total * 1e6 for r in out["asyncio"]],
                    "subagents": [r["wall"] / total * 1e6 for r in out[variant]],
                },
            )
            self.add(
                "W7",
                f"{what}, {label}: peak RSS growth ({out[variant][-1]['kept']:,} records kept)",
                "MB",
                {
                    "asyncio": [r["peak_growth_kb"] / 1024 for r in out["asyncio"]],
                    "subagents": [r["peak_growth_kb"] / 1024 for r in out[variant]],
                },
            )

    def w8(self) -> None:
        """Message round trips between two live children against a memory object
        stream's, interleaved, in this process: p50 and p99 in microseconds."""
        n = self.size["w8_n"]
        runs = {"anyio": w8.stream_round_trips, "subagents": w8.subagents_round_trips}
        samples: dict[str, list[float]] = {"anyio": [], "subagents": []}
        for rep in range(self.size["reps"]):
            for impl in ("anyio", "subagents") if rep % 2 == 0 else ("subagents", "anyio"):
                samples[impl].extend(anyio.run(runs[impl], n, backend=self.backend))
        what = "send -> recv round trip between two live children vs a memory object stream"
        for q, target in ((0.5, 50.0), (0.99, None)):
            figures = {impl: [_quantile(v, q) * 1e6] for impl, v in samples.items()}
            row = self.add(
                "W8",
                f"{what}: p{int(q * 100)}",
                "us",
                figures,
                target="" if target is None else f"<= {target:g} us and <= 3x stream",
            )
            if target is not None:
                sub, floor = figures["subagents"][0], figures["anyio"][0]
                row["meets_target"] = sub <= target and sub <= 3 * floor


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --------------------------------------------------------------------------- output


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": cpu,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "anyio": _version("anyio"),
        "subagents_commit": commit,
    }


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


def _fmt(value: float | None) -> str:
    if value is None:
        return "n/a"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def table(rows: list[dict[str, Any]], *, judge: bool = True) -> str:
    """The markdown table; ``judge=False`` leaves out ok/MISS (tiny sizes prove nothing)."""
    head = ["", "figure", "asyncio", "anyio", "subagents", "x asyncio", "x anyio", "target", ""]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        m = row["median"]
        x_a = row.get("x_asyncio")
        x_b = row.get("x_anyio")
        if "x_disabled" in row:
            x_a, x_b = None, None
        ok = row.get("meets_target") if judge else None
        mark = "" if ok is None else ("ok" if ok else "MISS")
        sub = _fmt(m.get("subagents"))
        if "x_disabled" in row:
            sub += f" ({row['x_disabled']:.2f}x disabled)"
        if not m:
            sub = "n/a"
        unit = f" ({row['unit']})" if row["unit"] and row["unit"] != "x" else ""
        cells = [
            row["workload"],
            row["figure"] + unit,
            _fmt(m["asyncio"]) if "asyncio" in m else "",
            _fmt(m["anyio"]) if "anyio" in m else "",
            sub,
            "" if x_a is None else f"{x_a:.2f}",
            "" if x_b is None else f"{x_b:.2f}",
            row["target"],
            mark,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one repetition")
    parser.add_argument(
        "-w",
        "--workloads",
        default=",".join(WORKLOADS),
        help="comma-separated subset of W1..W8 (default: all)",
    )
    parser.add_argument("-r", "--reps", type=int, help="repetitions of in-process timings")
    parser.add_argument(
        "-o", "--out", type=Path, help="JSON lines file (default benchmarks/results/...)"
    )
    parser.add_argument(
        "--backend",
        choices=("asyncio", "trio"),
        default="asyncio",
        help="backend for subagents and the anyio floor (the asyncio floor is always asyncio)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child_main(json.loads(args.child))
        return 0
    chosen = [w.strip().upper() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in chosen if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(unknown)}; choose from {WORKLOADS}")
    bench = Bench(QUICK if args.quick else FULL, args.backend, args.reps)
    info = machine()
    info.update(backend=args.backend, quick=args.quick, sizes=bench.size)
    print(
        f"# subagents benchmark, {info['date']}: {info['nproc']} CPU(s), {info['cpu']}, "
        f"Python {info['python']}, anyio {info['anyio']}, backend {args.backend}"
        + (" (quick)" if args.quick else ""),
        flush=True,
    )
    t0 = perf_counter()
    for name in chosen:
        t = perf_counter()
        getattr(bench, name.lower())()
        print(f"#   {name} done in {perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
    info["elapsed_s"] = perf_counter() - t0
    print(table(bench.rows, judge=not args.quick))
    print(f"# {info['elapsed_s']:.1f} s in all", flush=True)
    out = args.out
    if out is None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        out = ROOT / "benchmarks" / "results" / f"bench-{stamp}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        f.write(json.dumps({"machine": info}) + "\n")
        for row in bench.rows:
            f.write(json.dumps(row) + "\n")
    print(f"# JSON lines: {out}")
    missed = [r for r in bench.rows if r.get("meets_target") is False]
    if missed and not args.quick:
        print(f"# {len(missed)} figure(s) miss their target", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
