"""The text and JSON forms of what ``python -m signals`` prints (see :mod:`signals.cli._main`).

Each ``*_json`` function returns the JSON-ready form of one command's result; each
``*_text`` function the lines a person reads. Absent values print as ``-`` in text and as
``null`` in JSON; times are Unix seconds in JSON and ISO 8601 (UTC) in text. Also the
output plumbing: password-free URLs for messages, library logs on stderr, a quiet broken pipe.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    from signals._model import Receipt, Signal, StreamPart, ThreadInfo
    from signals._schedules import Schedule
    from signals.kit._core import DeadLetter

__all__ = [
    "compact", "dead_letters_json", "dead_letters_text", "inspect_text", "iso",
    "logs_to_stderr", "part_json", "part_text", "pending_json", "pending_text", "receipt_json",
    "receipt_text", "redact", "scrub", "silence_stdout", "table", "threads_json", "threads_text",
]


def iso(ts: float | None) -> str:
    """``ts`` (Unix seconds) as ISO 8601 UTC with milliseconds; ``-`` for ``None``."""
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _cell(value: object) -> str:
    return "-" if value is None or value == "" else str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns, two spaces apart, headers first (no trailing spaces)."""
    cells = [list(headers), *([_cell(v) for v in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def compact(value: Any) -> str:
    """``value`` as one line of JSON."""
    return json.dumps(value, separators=(",", ":"))


# -- threads ----------------------------------------------------------------------------------


def threads_json(threads: Sequence[ThreadInfo]) -> list[dict[str, Any]]:
    """``[{"thread_key", "owner", "runtime_id", "host", "pid", "since", "pending_count",
    "last_activity"}]`` (``pending_count`` and ``owner`` as in earlier releases)."""
    return [
        {
            "thread_key": t.thread_key, "owner": t.owner, "runtime_id": t.runtime_id or None,
            "host": t.host, "pid": t.pid, "since": t.since, "pending_count": t.pending,
            "last_activity": t.last_activity,
        }
        for t in threads
    ]


def threads_text(threads: Sequence[ThreadInfo], active: bool | None) -> str:
    if not threads:
        return {
            None: "no thread has pending signals",
            True: "no thread has an active run",
            False: "no idle thread has pending signals",
        }[active]
    headers = ("THREAD", "OWNER RUN", "RUNTIME", "HOST", "PID", "SINCE", "PENDING",
               "LAST ACTIVITY")
    return table(headers, [
        (t.thread_key, t.owner, t.runtime_id, t.host, t.pid, iso(t.since), t.pending,
         iso(t.last_activity))
        for t in threads
    ])


# -- pending ----------------------------------------------------------------------------------


def pending_json(thread_key: str, signals: Sequence[Signal]) -> dict[str, Any]:
    """``{"thread_key", "pending": [{"id", "type", "mode", "attempt", "created_at",
    "payload"}]}``."""
    return {
        "thread_key": thread_key,
        "pending": [
            {"id": s.id, "type": s.type, "mode": s.mode, "attempt": s.attempt,
             "created_at": s.created_at, "payload": s.payload}
            for s in signals
        ],
    }


def pending_text(thread_key: str, signals: Sequence[Signal]) -> str:
    if not signals:
        return f"no pending signals on {thread_key!r}"
    return table(("ID", "TYPE", "MODE", "ATTEMPT"),
                 [(s.id, s.type, s.mode, s.attempt) for s in signals])


# -- receipts and dead letters ----------------------------------------------------------------


def receipt_json(receipt: Receipt) -> dict[str, Any]:
    """``{"signal_id", "status"}`` plus ``run_id``, ``result``, ``error``, ``at`` when set."""
    return {"signal_id": receipt.signal_id, **receipt.to_dict()}


def receipt_text(found: dict[str, Any]) -> str:
    parts = [f"{found['signal_id']}: {found['status']}"]
    parts += [f"{k}={found[k]}" for k in ("run_id", "error") if found.get(k)]
    if "result" in found:
        parts.append(f"result={json.dumps(found['result'])}")
    return "  ".join(parts)


def dead_letters_json(
    thread_key: str, dead: Sequence[DeadLetter], retried: list[str], purged: int
) -> dict[str, Any]:
    """``{"thread_key", "dead_letters": [{"id", "type", "attempts", "error", "at"}],
    "retried": [ids], "purged": n}``."""
    rows = [
        {"id": d.signal.id, "type": d.signal.type, "attempts": d.attempts, "error": d.error,
         "at": d.at}
        for d in dead
    ]
    return {"thread_key": thread_key, "dead_letters": rows, "retried": retried, "purged": purged}


def dead_letters_text(report: dict[str, Any]) -> str:
    lines = [f"retried: {', '.join(report['retried'])}"] if report["retried"] else []
    if report["purged"]:
        lines.append(f"purged: {report['purged']}")
    if not report["dead_letters"]:
        lines.append(f"no dead letters on {report['thread_key']!r}")
    for d in report["dead_letters"]:
        lines.append(f"{d['id']}  attempts={d['attempts']}  at={iso(d['at'])}  {d['error'] or ''}")
    return "\n".join(lines)


# -- stream parts -----------------------------------------------------------------------------


def part_json(part: StreamPart) -> str:
    """One part as one line of JSON: ``{"cursor", "thread_key", "kind", "run_id",
    "signal_id", "data", "at"}``."""
    return compact({
        "cursor": part.cursor, "thread_key": part.thread_key, "kind": part.kind,
        "run_id": part.run_id, "signal_id": part.signal_id, "data": part.data, "at": part.at,
    })


def part_text(part: StreamPart) -> str:
    """``cursor kind run signal data`` (``-`` for no run or signal; data as JSON)."""
    return f"{part.cursor} {part.kind} {_cell(part.run_id)} {_cell(part.signal_id)} " + compact(
        part.data
    )


# -- inspect ----------------------------------------------------------------------------------


def inspect_text(report: dict[str, Any]) -> str:
    """The text form of ``inspect``'s JSON report."""
    lines = [f"thread:  {report['thread_key']}"]
    lease = report["lease"]
    if lease is None:
        lines.append("lease:   free (no owner)")
    else:
        ttl = "no expiry" if lease["ttl_ms"] is None else f"{lease['ttl_ms']} ms left"
        lines.append(f"lease:   owner={lease['owner']}  ttl={ttl}  token={_cell(lease['token'])}")
    lines.append(f"queued:  {report['pending_count']} signal(s)")
    lines += [
        f"  {s['entry_id']}  id={s['id']}  type={s['type']}  mode={s['mode']}"
        f"  created_at={iso(s['created_at'])}"
        for s in report["signals"]
    ]
    hidden = report["pending_count"] - len(report["signals"])
    if hidden > 0:
        lines.append(f"  ... and {hidden} more (--limit)")
    return "\n".join(lines)


# -- plumbing -----------------------------------------------------------------------------------


def redact(url: str) -> str:
    """``url`` without its password, for messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<invalid url>"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[-1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def scrub(text: str, url: str) -> str:
    """``text`` without the password of ``url``."""
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    return text.replace(password, "***") if password else text


@contextmanager
def logs_to_stderr() -> Iterator[None]:
    """The library's warnings and errors on stderr (structlog prints to stdout by default,
    which would mix them into the output); the previous configuration is restored after."""
    import logging

    import structlog

    saved = structlog.get_config() if structlog.is_configured() else None
    structlog.configure(
        processors=[structlog.processors.add_log_level, structlog.processors.TimeStamper("iso"),
                    structlog.dev.ConsoleRenderer(colors=False)],
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )
    try:
        yield
    finally:
        if saved is None:
            structlog.reset_defaults()
        else:
            structlog.configure(**saved)


def silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush does not fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def schedule_json(s: Schedule) -> dict[str, Any]:
    """A :class:`~signals.Schedule` as the CLI prints it with ``--json``."""
    return {"schedule_id": s.schedule_id, "thread_key": s.thread_key, "every_ms": s.every_ms,
            "cron": s.cron, "tz": s.tz, "catch_up": s.catch_up, "next_at": s.next_at,
            "signal": s.signal.to_dict()}


def schedules_text(found: list[dict[str, Any]]) -> str:
    if not found:
        return "no schedules"
    rows = [("schedule", "thread", "when", "catch-up", "next tick (UTC)")]
    for s in found:
        when = f"every {s['every_ms']} ms" if s["every_ms"] is not None else (
            f"cron {s['cron']} ({s['tz']})")
        rows.append((s["schedule_id"], s["thread_key"], when, s["catch_up"],
                     time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(s["next_at"]))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)
