"""``subagents events timeline``: a run as one self-contained HTML file.

One bar per agent on a time axis, in the order and nesting of ``events tree``, coloured by
status, its queue wait shaded at its start, the envelope's summary shown on hover (or
when the page's address names the bar: ``run.html#task-<task id>``; a task id that is not
a plain token of letters, digits and ``-_.:`` cannot be an HTML id, and its bar is
``#row-<n>``, the n-th bar from the top, its id still in ``data-task``). The page is
static HTML and CSS: no script, no font, no image, no address of any kind, and a
Content-Security-Policy that forbids loading anything, so opening it makes no network
request (the tests check it in a headless browser).
"""

from __future__ import annotations

import html
import math
import re
from datetime import UTC, datetime

from ._event_runs import RunLog, TaskRun
from ._event_tree import error_text, format_duration, tree_rows

__all__ = ["CSP", "render_timeline"]

CSP = "default-src 'none'; style-src 'unsafe-inline'"
"""The page's Content-Security-Policy: its own inline style, nothing else."""

_STATUSES = ("completed", "error", "timeout", "cancelled", "running", "queued")
_PLAIN_ID = re.compile(r"[A-Za-z0-9_.:-]{1,200}")

_STYLE = """
:root { --label: 320px; }
* { box-sizing: border-box; }
body { font: 13px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 18px 22px;
  color: #1f2328; background: #fff; }
h1 { font-size: 17px; margin: 0 0 2px; }
.summary { color: #57606a; margin: 0 0 10px; }
.legend { display: flex; gap: 14px; flex-wrap: wrap; margin: 0 0 12px; color: #57606a; }
.legend span::before { content: ""; display: inline-block; width: 11px; height: 11px;
  margin-right: 5px; vertical-align: -1px; border-radius: 2px; background: var(--c); }
.legend .queue-key::before { background: repeating-linear-gradient(135deg, #8c959f 0 2px,
  #d0d7de 2px 4px); }
.chart { position: relative; }
.axis { position: relative; height: 20px; margin-left: var(--label);
  border-bottom: 1px solid #d0d7de; }
.tick { position: absolute; bottom: 3px; transform: translateX(-50%); font-size: 11px;
  color: #57606a; white-space: nowrap; }
.tick.first { transform: none; }
.grid { position: absolute; top: 20px; bottom: 0; left: var(--label); right: 0;
  pointer-events: none; }
.grid div { position: absolute; top: 0; bottom: 0; border-left: 1px solid #eaeef2; }
.row { position: relative; display: flex; align-items: center; height: 21px; }
.row:hover { background: #f6f8fa; }
.session { font-weight: 600; height: 24px; padding-top: 4px; }
.label { width: var(--label); flex: none; overflow: hidden; white-space: pre;
  text-overflow: ellipsis; font: 12px/21px ui-monospace, "SFMono-Regular", Menlo,
  Consolas, monospace; padding-right: 8px; }
.track { position: relative; flex: 1; height: 21px; }
.bar { position: absolute; top: 4px; height: 13px; min-width: 2px; border-radius: 2px;
  background: var(--c); }
.queue { position: absolute; left: 0; top: 0; bottom: 0; border-radius: 2px 0 0 2px;
  background: repeating-linear-gradient(135deg, rgba(255,255,255,.75) 0 2px,
  rgba(255,255,255,.35) 2px 4px); }
.open { border-right: 2px dashed #1f2328; }
.tip { display: none; position: absolute; top: 16px; left: 0; z-index: 3; width: max-content;
  max-width: 520px; padding: 7px 9px; background: #fff; color: #1f2328;
  border: 1px solid #d0d7de; border-radius: 6px; box-shadow: 0 4px 14px rgba(0,0,0,.14);
  white-space: pre-wrap; font: 12px/1.45 ui-monospace, Menlo, Consolas, monospace; }
.tip.left { left: auto; right: 0; }
.bar:hover .tip, .bar:target .tip { display: block; }
.failed .label { color: #cf222e; font-weight: 600; }
.status-completed { --c: #2da44e; }
.status-error { --c: #cf222e; }
.status-timeout { --c: #bc4c00; }
.status-cancelled { --c: #bf8700; }
.status-running { --c: #0969da; }
.status-queued { --c: #8c959f; }
"""


def render_timeline(run: RunLog, *, title: str) -> str:
    """The whole HTML page of ``run``; ``title`` names it (the log's file name)."""
    start = run.first_ms
    span = max(run.last_ms - start, 1)
    rows = []
    bars = 0
    for prefix, label, task in tree_rows(run):
        if task is None:
            rows.append(f'<div class="row session"><div class="label">{_e(label)}</div></div>')
        else:
            bars += 1
            rows.append(_row(prefix + label, task, start, span, bars))
    ticks, lines = _axis(span)
    legend = (
        "".join(f'<span class="status-{status}">{status}</span>' for status in _STATUSES)
        + '<span class="queue-key">queue wait</span>'
    )
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en">',
            "<head>",
            '<meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
            f"<title>subagents run · {_e(title)}</title>",
            f"<style>{_STYLE}</style>",
            "</head>",
            "<body>",
            f"<h1>subagents run · {_e(title)}</h1>",
            f'<p class="summary">{_e(_summary(run))}</p>',
            f'<div class="legend">{legend}</div>',
            '<div class="chart">',
            f'<div class="axis">{ticks}</div>',
            f'<div class="grid">{lines}</div>',
            *rows,
            "</div>",
            "</body>",
            "</html>",
            "",
        ]
    )


def _row(label: str, task: TaskRun, start: int, span: int, number: int) -> str:
    left = (task.spawned_ms - start) / span * 100
    width = task.duration_ms / span * 100
    queue = min(task.queue_ms / task.duration_ms * 100, 100) if task.duration_ms else 0
    classes = f"row status-{_e(task.status)}" + (" failed" if task.failed else "")
    bar = f"bar status-{_e(task.status)}" + ("" if task.ended else " open")
    tip = "tip left" if left > 50 else "tip"
    # An id attribute holds no whitespace; the two prefixes keep the two kinds apart.
    anchor = f"task-{task.task_id}" if _PLAIN_ID.fullmatch(task.task_id) else f"row-{number}"
    return (
        f'<div class="{classes}"><div class="label">{_e(label)}</div>'
        f'<div class="track"><div class="{bar}" id="{anchor}" '
        f'data-task="{_e(task.task_id)}" '
        f'data-path="{_e(task.agent_path)}" data-status="{_e(task.status)}" '
        f'style="left:{left:.3f}%;width:{width:.3f}%">'
        f'<div class="queue" style="width:{queue:.2f}%"></div>'
        f'<div class="{tip}">{_e(_hover(task))}</div></div></div></div>'
    )


def _hover(task: TaskRun) -> str:
    """The envelope's summary (what it says so far, for a task still going)."""
    facts = [
        f"{task.agent_path}  [{task.task_id}]",
        f"agent {task.agent} · {task.mode} · {task.status}",
        f"duration {format_duration(task.duration_ms)} · queue {format_duration(task.queue_ms)}",
        f"tokens in {task.input_tokens} / out {task.output_tokens}"
        f" · iterations {task.iterations}"
        + (f" · attempts {task.attempts}" if task.attempts > 1 else ""),
    ]
    failure = error_text(task)
    if failure:
        facts.append(f"error: {failure}")
    if task.output:
        facts.append("output: " + " ".join(task.output.split()))
    return "\n".join(facts)


def _summary(run: RunLog) -> str:
    counts = ", ".join(f"{n} {status}" for status, n in run.counts().items())
    if not run.tasks:  # nothing began: no "from 1970-01-01"
        return "no agents"
    try:
        moment = datetime.fromtimestamp(run.first_ms / 1000, tz=UTC)
        began = moment.strftime("%Y-%m-%d %H:%M:%S UTC")
    except (ValueError, OverflowError, OSError):  # a log is any file: an impossible time
        began = f"timestamp_ms={run.first_ms}"
    tokens_in = sum(t.input_tokens for t in run.tasks.values())
    tokens_out = sum(t.output_tokens for t in run.tasks.values())
    agents = len(run.tasks)
    return (
        f"{agents} agent{'s' if agents != 1 else ''} ({counts or 'none'}) · "
        f"tokens in {tokens_in} / out {tokens_out} · "
        f"{format_duration(max(run.last_ms - run.first_ms, 0))} from {began}"
    )


def _axis(span: int) -> tuple[str, str]:
    """The tick labels and grid lines of a time axis ``span`` ms long (1-2-5 steps, about
    eight of them)."""
    raw = span / 8
    magnitude = 10 ** math.floor(math.log10(raw)) if raw >= 1 else 1
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    ticks, lines = [], []
    at = 0
    while at <= span:
        left = at / span * 100
        first = " first" if at == 0 else ""
        ticks.append(f'<div class="tick{first}" style="left:{left:.3f}%">{_tick(at, step)}</div>')
        lines.append(f'<div style="left:{left:.3f}%"></div>')
        at += step
    return "".join(ticks), "".join(lines)


def _tick(ms: int, step: int) -> str:
    if step < 1000:
        return f"{ms} ms"
    if step < 60_000:
        return f"{ms / 1000:g} s"
    return f"{ms / 60_000:g} min"


def _e(text: str) -> str:
    return html.escape(text, quote=True)
