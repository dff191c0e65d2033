"""``python -m signals``: inspect threads, leases and inboxes on Redis.

Commands::

    python -m signals inspect THREAD_KEY --redis-url URL [--key-prefix P] [--limit N] [--json]
    python -m signals threads --redis-url URL [--key-prefix P] [--limit N] [--json]

``--key-prefix`` is the ``key_prefix`` of the ``RedisStreamsPubSub`` the runtime runs on
(default ``pubsub``): the runtime's leases then live under ``<P>:lease`` and its inbox under
``<P>:signals``. ``--lease-prefix`` / ``--inbox-prefix`` override those two when you built a
``RedisLeaseProvider`` / ``RedisSignalInbox`` yourself. Exit codes: 0 ok, 1 usage error (bad
arguments or URL), 2 Redis unreachable (one line on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NoReturn, TextIO
from urllib.parse import urlsplit, urlunsplit

import anyio

from leases import BackendUnavailableError

if TYPE_CHECKING:
    from collections.abc import Sequence

    import redis.asyncio

__all__ = ["DEFAULT_KEY_PREFIX", "ThreadReport", "inspect_thread", "list_threads", "main"]

DEFAULT_KEY_PREFIX = "pubsub"
"""The default ``key_prefix`` of ``RedisStreamsPubSub``."""

EXIT_OK = 0
EXIT_USAGE = 1
EXIT_UNAVAILABLE = 2


@dataclass(frozen=True, slots=True)
class Prefixes:
    """Where the runtime's leases and inbox live for one pub/sub ``key_prefix``."""

    lease: str
    inbox: str

    @classmethod
    def for_pubsub(
        cls, key_prefix: str, *, lease: str | None = None, inbox: str | None = None
    ) -> Prefixes:
        return cls(lease=lease or f"{key_prefix}:lease", inbox=inbox or f"{key_prefix}:signals")


@dataclass(frozen=True, slots=True)
class ThreadReport:
    """What ``inspect`` found for one thread (``to_dict`` is the ``--json`` form)."""

    thread_key: str
    owner: str | None
    ttl_ms: int | None
    token: int | None
    pending_count: int
    signals: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        lease = (
            None
            if self.owner is None
            else {"owner": self.owner, "ttl_ms": self.ttl_ms, "token": self.token}
        )
        return {
            "thread_key": self.thread_key,
            "lease": lease,
            "pending_count": self.pending_count,
            "signals": self.signals,
        }


def _redact(url: str) -> str:
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


def _connect(url: str) -> redis.asyncio.Redis:
    """A client that fails fast: short connect timeout, no retries."""
    import redis.asyncio
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    return redis.asyncio.Redis.from_url(
        url, socket_connect_timeout=3, socket_timeout=5, retry=Retry(NoBackoff(), 0)
    )


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


async def inspect_thread(
    client: redis.asyncio.Redis, thread_key: str, prefixes: Prefixes, *, limit: int = 10
) -> ThreadReport:
    """Lease and queued signals of ``thread_key`` (the first ``limit`` entries)."""
    from leases import RedisLeaseProvider

    from ._redis_inbox import RedisSignalInbox

    provider = RedisLeaseProvider(client=client, key_prefix=prefixes.lease)
    inbox = RedisSignalInbox(client=client, key_prefix=prefixes.inbox)
    info = await provider.lease_info(thread_key)
    count = await inbox.inbox_pending_count(thread_key)
    entries = await inbox.inbox_read(thread_key, limit=limit) if limit > 0 else []
    signals = [
        {
            "entry_id": e.entry_id,
            "id": e.signal.id,
            "type": e.signal.type,
            "mode": e.mode,
            "created_at": e.signal.created_at,
        }
        for e in entries
    ]
    return ThreadReport(
        thread_key=thread_key,
        owner=None if info is None else info.owner,
        ttl_ms=None if info is None else info.ttl_ms_remaining,
        token=None if info is None else info.token,
        pending_count=count,
        signals=signals,
    )


async def list_threads(
    client: redis.asyncio.Redis, prefixes: Prefixes, *, limit: int = 100
) -> list[dict[str, Any]]:
    """Threads with pending signals: key, pending count and lease owner of each."""
    from leases import RedisLeaseProvider

    from ._redis_inbox import RedisSignalInbox

    provider = RedisLeaseProvider(client=client, key_prefix=prefixes.lease)
    inbox = RedisSignalInbox(client=client, key_prefix=prefixes.inbox)
    rows: list[dict[str, Any]] = []
    for thread in await inbox.inbox_pending_threads(limit=limit):
        rows.append(
            {
                "thread_key": thread,
                "pending_count": await inbox.inbox_pending_count(thread),
                "owner": await provider.get_lease_owner(thread),
            }
        )
    return rows


def _print_report(report: ThreadReport, out: TextIO) -> None:
    print(f"thread:  {report.thread_key}", file=out)
    if report.owner is None:
        print("lease:   free (no owner)", file=out)
    else:
        ttl = "no expiry" if report.ttl_ms is None else f"{report.ttl_ms} ms left"
        token = "-" if report.token is None else str(report.token)
        print(f"lease:   owner={report.owner}  ttl={ttl}  token={token}", file=out)
    print(f"queued:  {report.pending_count} signal(s)", file=out)
    for s in report.signals:
        print(
            f"  {s['entry_id']}  id={s['id']}  type={s['type']}  mode={s['mode']}"
            f"  created_at={_iso(s['created_at'])}",
            file=out,
        )
    hidden = report.pending_count - len(report.signals)
    if hidden > 0:
        print(f"  ... and {hidden} more (--limit)", file=out)


def _print_threads(rows: list[dict[str, Any]], out: TextIO) -> None:
    if not rows:
        print("no thread has pending signals", file=out)
        return
    width = max(len("THREAD"), *(len(r["thread_key"]) for r in rows))
    print(f"{'THREAD':<{width}}  PENDING  OWNER", file=out)
    for r in rows:
        owner = r["owner"] or "-"
        print(f"{r['thread_key']:<{width}}  {r['pending_count']:>7}  {owner}", file=out)


class _Parser(argparse.ArgumentParser):
    """Usage errors exit 1, so that exit code 2 always means "Redis unreachable"."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m signals``."""
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    parser = _Parser(
        prog=script if script.startswith("signals-") else "python -m signals",
        description="Inspect signal-runtime threads on Redis: lease owner and queued signals.",
    )
    common = _Parser(add_help=False)
    common.add_argument(
        "--redis-url",
        default=os.environ.get("REDIS_URL"),
        help="Redis URL, e.g. redis://127.0.0.1:6379/0 (default: $REDIS_URL)",
    )
    common.add_argument(
        "--key-prefix",
        default=DEFAULT_KEY_PREFIX,
        help="key_prefix of the RedisStreamsPubSub the runtime uses (default: %(default)s)",
    )
    common.add_argument(
        "--lease-prefix", default=None, help="lease key prefix (default: <key-prefix>:lease)"
    )
    common.add_argument(
        "--inbox-prefix", default=None, help="inbox key prefix (default: <key-prefix>:signals)"
    )
    common.add_argument("--json", action="store_true", help="print JSON instead of text")
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser
    )
    p_inspect = sub.add_parser(
        "inspect", parents=[common], help="lease and queued signals of one thread"
    )
    p_inspect.add_argument("thread_key", metavar="THREAD_KEY")
    p_inspect.add_argument(
        "--limit", type=int, default=10, help="show the first N queued signals (default: 10)"
    )
    p_threads = sub.add_parser("threads", parents=[common], help="threads with pending signals")
    p_threads.add_argument(
        "--limit", type=int, default=100, help="list at most N threads (default: 100)"
    )
    return parser


async def _run(args: argparse.Namespace, client: redis.asyncio.Redis, out: TextIO) -> None:
    prefixes = Prefixes.for_pubsub(
        args.key_prefix, lease=args.lease_prefix, inbox=args.inbox_prefix
    )
    try:
        if args.command == "inspect":
            report = await inspect_thread(client, args.thread_key, prefixes, limit=args.limit)
            if args.json:
                print(json.dumps(report.to_dict()), file=out)
            else:
                _print_report(report, out)
        else:
            rows = await list_threads(client, prefixes, limit=args.limit)
            if args.json:
                print(json.dumps(rows), file=out)
            else:
                _print_threads(rows, out)
    finally:
        await client.aclose()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m signals`` and ``signals-inspect``; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.redis_url:
        parser.error("--redis-url is required (or set $REDIS_URL)")
    if args.command == "inspect" and not args.thread_key:
        parser.error("THREAD_KEY must be a non-empty string")
    if args.limit < 0:
        parser.error("--limit must be >= 0")
    url = _redact(args.redis_url)
    try:
        client = _connect(args.redis_url)
    except ValueError as exc:  # redis-py's error for a malformed URL
        print(f"error: invalid Redis URL {url}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        anyio.run(_run, args, client, sys.stdout, backend="asyncio")
    except Exception as exc:
        reason = _unavailable(exc)
        if reason is None:
            raise
        print(f"error: cannot reach Redis at {url}: {reason}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    return EXIT_OK


def _unavailable(exc: Exception) -> Exception | None:
    """The connection error in ``exc`` (or in an exception group around it), else ``None``."""
    import redis.exceptions

    if isinstance(exc, ExceptionGroup):
        for inner in exc.exceptions:
            found = _unavailable(inner)
            if found is not None:
                return found
        return None
    unavailable = (
        BackendUnavailableError,
        redis.exceptions.ConnectionError,
        redis.exceptions.TimeoutError,
    )
    return exc if isinstance(exc, unavailable) else None
