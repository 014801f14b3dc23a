"""``subagents batch status --store PATH``: each batch of a store, read without writing.

Per batch (a manifest, ``_cli_batch_journal``): its items' envelopes counted by status,
the first failures, and, while it runs, what runs, its rate and an ETA. The counts read
the batch's unread entries, one ``GROUP BY`` over its session; the manifests are found
by a pass over the unread deliveries: a status command, not a per-item path.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
from typing import Final

from ._cli_batch_journal import MANIFEST, items_session, now_ms
from ._cli_batch_progress import clock
from ._json import dumps_str, loads
from ._processes import pid_running
from .store import DEFAULT_BUSY_TIMEOUT, StoreError
from .store._readonly import ReadOnlyStore

__all__ = ["run_status"]

_FAILURES: Final = 5
_PREFIX: Final = "batch:"


def _manifests(conn: sqlite3.Connection) -> list[tuple[str, dict[str, object]]]:
    rows = conn.execute(
        "SELECT d.session, e.body FROM deliveries d JOIN envelopes e ON e.id = d.envelope_id "
        "WHERE d.state = 'stored' AND d.recipient = '' AND d.task_id = ? "
        "AND substr(d.session, 1, 6) = ? ORDER BY d.session",
        (MANIFEST, _PREFIX),
    ).fetchall()
    found: list[tuple[str, dict[str, object]]] = []
    for session, body in rows:
        try:
            envelope = loads(body)
            output = envelope.get("output") if isinstance(envelope, dict) else None
            manifest = loads(output) if isinstance(output, str) else None
        except ValueError:
            continue
        if (
            isinstance(envelope, dict)
            and envelope.get("agent") == "batch"
            and isinstance(manifest, dict)
            and isinstance(manifest.get("generation"), int)
        ):
            found.append((str(session)[len(_PREFIX) :], dict(manifest)))
    return found


def _counts(conn: sqlite3.Connection, session: str) -> tuple[dict[str, int], list[list[str]]]:
    status = "json_extract(CAST(e.body AS TEXT), '$.status')"
    joined = (
        "FROM deliveries d JOIN envelopes e ON e.id = d.envelope_id "
        "WHERE d.session = ? AND d.recipient = '' AND d.state = 'stored'"
    )
    counts = {
        str(s): int(n)
        for s, n in conn.execute(f"SELECT {status}, count(*) {joined} GROUP BY 1", (session,))
    }
    failures = [
        [str(task_id), str(error or "")]
        for task_id, error in conn.execute(
            f"SELECT d.task_id, json_extract(CAST(e.body AS TEXT), '$.error') {joined} "
            f"AND {status} <> 'completed' ORDER BY d.id LIMIT ?",
            (session, _FAILURES),
        )
    ]
    return counts, failures


def _alive(pid: object, started: object) -> bool:
    """The manifest's process still runs: its pid lives and, where the manifest recorded
    its start time (Linux), started then (a reused pid is another process)."""
    if not isinstance(pid, int) or isinstance(pid, bool):
        return False
    return pid_running(pid, started if isinstance(started, int) else None)


def _report(conn: sqlite3.Connection) -> list[dict[str, object]]:
    conn.execute("BEGIN")
    try:
        reports: list[dict[str, object]] = []
        for name, manifest in _manifests(conn):
            generation = manifest["generation"]
            assert isinstance(generation, int)
            counts, failures = _counts(conn, items_session(name, generation))
            state = manifest.get("state")
            if state == "running" and not _alive(manifest.get("pid"), manifest.get("pid_start")):
                state = "killed"
            total = manifest.get("total")
            done = sum(counts.values())
            rate = manifest.get("rate")
            eta = None
            if state == "running" and isinstance(total, int) and isinstance(rate, (int, float)):
                eta = (total - done) / rate if rate > 0 else None
            reports.append(
                {
                    "batch": name,
                    "generation": generation,
                    "state": state,
                    "total": total,
                    "done": done,
                    "by_status": counts,
                    "running": manifest.get("running") if state == "running" else 0,
                    "rate": rate,
                    "eta_s": None if eta is None else round(eta, 1),
                    "updated_ms": manifest.get("updated_ms"),
                    "failures": failures,
                }
            )
        return reports
    finally:
        conn.execute("ROLLBACK")


def _format(report: dict[str, object]) -> list[str]:
    by_status = report["by_status"]
    assert isinstance(by_status, dict)
    counts = ", ".join(f"{n} {s}" for s, n in sorted(by_status.items())) or "nothing yet"
    lines = [
        f"batch {report['out']} (run {report['generation']}): {report['state']}",
        f"  {report['done']}/{report['total']} done: {counts}",
    ]
    if report["state"] == "running":
        age = (now_ms() - int(str(report["updated_ms"]))) / 1000
        eta = report["eta_s"]
        lines.append(
            f"  {report['running']} running, {report['rate']}/s, ETA "
            f"{clock(eta if isinstance(eta, float) else None)} (as of {age:.0f} s ago)"
        )
    elif report["state"] == "killed":
        lines.append("  its process is gone: `subagents batch run --resume ...` goes on")
    failures = report["failures"]
    assert isinstance(failures, list)
    for task_id, error in failures:
        lines.append(f"  failed {task_id}: {error[:200]}")
    return lines


def run_status(args: argparse.Namespace) -> int:
    """``subagents batch status``."""
    try:
        with ReadOnlyStore(args.store, busy_timeout=DEFAULT_BUSY_TIMEOUT) as store:
            reports = store.read(_report)
    except StoreError as exc:
        print(f"subagents batch status: {exc}", file=sys.stderr)
        return 1
    # The folder the journal named the batch from: the store's real one (batch_name).
    here = os.path.dirname(os.path.realpath(args.store))
    for report in reports:
        # The results file as seen from the current directory.
        report["out"] = os.path.relpath(os.path.join(here, str(report["batch"])))
    if args.json:
        for report in reports:
            print(dumps_str(report))
        return 0
    if not reports:
        print(f"no batch in {args.store}")
        return 0
    for report in reports:
        print("\n".join(_format(report)))
    return 0
