"""``python -m signals``: inspect threads, leases, inboxes, receipts and dead letters on Redis.

Commands::

    python -m signals inspect THREAD_KEY --redis-url URL [--key-prefix P] [--limit N] [--json]
    python -m signals threads --redis-url URL [--key-prefix P] [--limit N] [--json]
    python -m signals receipt THREAD_KEY SIGNAL_ID --redis-url URL [--json]
    python -m signals dead-letters THREAD_KEY [--retry ID ... | --purge] --redis-url URL [--json]

``--key-prefix`` is the ``key_prefix`` of the ``RedisStreamsPubSub`` the runtime runs on
(default ``pubsub``): the runtime's leases then live under ``<P>:lease`` and its inbox under
``<P>:signals``. ``--lease-prefix`` / ``--inbox-prefix`` override those two when you built a
``RedisLeaseProvider`` / ``RedisSignalInbox`` yourself. Exit codes: 0 ok, 1 usage error (bad
arguments or URL), 2 Redis unreachable (one line on stderr, no traceback), 3 not found (an
unknown receipt).
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

    from leases import RedisLeaseProvider

    from ._redis_store import RedisSignalStore

__all__ = ["DEFAULT_KEY_PREFIX", "ThreadReport", "inspect_thread", "list_threads", "main"]

DEFAULT_KEY_PREFIX = "pubsub"
"""The default ``key_prefix`` of ``RedisStreamsPubSub``."""

EXIT_OK = 0
EXIT_USAGE = 1
EXIT_UNAVAILABLE = 2
EXIT_NOT_FOUND = 3


class _NotFound(Exception):
    """The thing asked for does not exist (exit code 3)."""


def _describe_receipt(found: dict[str, Any]) -> str:
    parts = [f"{found['signal_id']}: {found['status']}"]
    parts += [f"{k}={found[k]}" for k in ("run_id", "error") if found.get(k)]
    if "result" in found:
        parts.append(f"result={json.dumps(found['result'])}")
    return "  ".join(parts)


def _describe_dead(report: dict[str, Any]) -> str:
    lines = [f"retried: {', '.join(report['retried'])}"] if report["retried"] else []
    if report["purged"]:
        lines.append(f"purged: {report['purged']}")
    if not report["dead_letters"]:
        lines.append(f"no dead letters on {report['thread_key']!r}")
    for d in report["dead_letters"]:
        lines.append(f"{d['id']}  attempts={d['attempts']}  at={_iso(d['at'])}  {d['error'] or ''}")
    return "\n".join(lines)


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
    provider, store = _parts(client, prefixes)
    info = await provider.lease_info(thread_key)
    count = await store.pending_count(thread_key)
    entries = await store.read(thread_key, limit=limit) if limit > 0 else []
    signals = [
        {
            "entry_id": e.entry_id,
            "id": e.signal.id,
            "type": e.signal.type,
            "mode": e.mode,
            "attempts": e.attempts,
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
    """Threads with pending signals or an owner: key, pending count and lease owner of each
    (the pending index, then the threads of every registered runtime)."""
    provider, store = _parts(client, prefixes)
    threads = list(await store.pending_threads(limit=limit))
    for runtime in await store.runtimes():
        threads += [t for t in await store.runtime_threads(runtime.runtime_id) if t not in threads]
    rows: list[dict[str, Any]] = []
    for thread in sorted(threads)[:limit]:
        owner = await provider.get_lease_owner(thread)
        count = await store.pending_count(thread)
        if owner is not None or count:
            rows.append({"thread_key": thread, "pending_count": count, "owner": owner})
    return rows


def _parts(
    client: redis.asyncio.Redis, prefixes: Prefixes
) -> tuple[RedisLeaseProvider, RedisSignalStore]:
    """The lease provider and store as the runtime builds them on ``RedisStreamsPubSub``."""
    from leases import RedisLeaseProvider

    from ._redis_store import RedisSignalStore

    provider = RedisLeaseProvider(client=client, key_prefix=prefixes.lease)
    return provider, RedisSignalStore(client=client, key_prefix=prefixes.inbox, leases=provider)


async def receipt_of(
    client: redis.asyncio.Redis, prefixes: Prefixes, thread_key: str, signal_id: str
) -> dict[str, Any] | None:
    """The receipt of one signal as JSON, or ``None`` when unknown."""
    _, store = _parts(client, prefixes)
    receipt = await store.receipt(thread_key, signal_id)
    return None if receipt is None else {"signal_id": signal_id, **receipt.to_dict()}


async def dead_letters(
    client: redis.asyncio.Redis, prefixes: Prefixes, thread_key: str, *,
    retry: Sequence[str] = (), purge: bool = False,
) -> dict[str, Any]:
    """List (and optionally retry or purge) the dead letters of one thread."""
    _, store = _parts(client, prefixes)
    retried = await store.retry_dead(thread_key, list(retry)) if retry else []
    if retried:
        from ._store import Notice

        await store.notify(None, Notice("work", thread_key))
    purged = await store.purge_dead(thread_key) if purge else 0
    rows = [
        {"id": d.signal.id, "type": d.signal.type, "attempts": d.attempts, "error": d.error,
         "at": d.at}
        for d in await store.dead_letters(thread_key, limit=1000)
    ]
    return {"thread_key": thread_key, "dead_letters": rows, "retried": retried, "purged": purged}


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
    p_receipt = sub.add_parser("receipt", parents=[common], help="what became of one signal")
    p_receipt.add_argument("thread_key", metavar="THREAD_KEY")
    p_receipt.add_argument("signal_id", metavar="SIGNAL_ID")
    p_dead = sub.add_parser(
        "dead-letters", parents=[common], help="signals that failed max_attempts deliveries"
    )
    p_dead.add_argument("thread_key", metavar="THREAD_KEY")
    action = p_dead.add_mutually_exclusive_group()
    action.add_argument("--retry", nargs="+", default=[], metavar="ID",
                        help="put these dead letters back into the inbox")
    action.add_argument("--purge", action="store_true", help="delete every dead letter")
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
        elif args.command == "threads":
            rows = await list_threads(client, prefixes, limit=args.limit)
            if args.json:
                print(json.dumps(rows), file=out)
            else:
                _print_threads(rows, out)
        elif args.command == "receipt":
            found = await receipt_of(client, prefixes, args.thread_key, args.signal_id)
            if found is None:
                print(f"no receipt for {args.signal_id!r} on {args.thread_key!r}", file=sys.stderr)
                raise _NotFound
            print(json.dumps(found) if args.json else _describe_receipt(found), file=out)
        else:
            dead = await dead_letters(client, prefixes, args.thread_key, retry=args.retry,
                                      purge=args.purge)
            print(json.dumps(dead) if args.json else _describe_dead(dead), file=out)
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
    if getattr(args, "limit", 0) < 0:
        parser.error("--limit must be >= 0")
    url = _redact(args.redis_url)
    try:
        client = _connect(args.redis_url)
    except ValueError as exc:  # redis-py's error for a malformed URL
        print(f"error: invalid Redis URL {url}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        anyio.run(_run, args, client, sys.stdout, backend="asyncio")
    except _NotFound:
        return EXIT_NOT_FOUND
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
