"""The ``signals`` command (the same as ``python -m signals``): see and control threads.

Commands::

    threads [--active | --idle] [--limit N]
        Every thread of the deployment (cluster-wide): those owned by a live runtime and
        those with pending signals. Columns: thread, owner run, runtime, host, pid, since,
        pending, last activity. --active: owned only; --idle: not owned only.
    inspect THREAD_KEY [--limit N]
        Lease of the thread (owner, TTL left, fencing token) and its first N queued signals.
    pending THREAD_KEY
        Signals accepted and not yet acknowledged, in order: id, type, mode, attempt
        (deliveries so far; 0 for one no run has taken yet).
    cancel THREAD_KEY ID [ID ...]
        Withdraw queued signals no run has taken yet; prints the ids withdrawn.
    abort THREAD_KEY [--run RUN] [--clear] [--reason TEXT]
        Cancel the active run (only RUN, if given); it ends at its next checkpoint with a
        run.cancelled part. --clear also withdraws every pending signal of the thread.
    tail THREAD_KEY [--after CURSOR] [--no-follow]
        The thread's output stream from the oldest part retained (or after CURSOR), one line
        per part: "cursor kind run signal data" (data as JSON). Follows new parts live until
        Ctrl-C (SIGINT), through Redis outages too (warnings on stderr); --no-follow stops
        at the current end.
    receipt THREAD_KEY SIGNAL_ID
        What became of one signal: status, run id, error, result.
    dead-letters THREAD_KEY [--retry ID [ID ...] | --purge]
        Signals that failed max_attempts deliveries; --retry puts those back into the inbox
        and wakes the workers, --purge deletes all of them.
    pause THREAD_KEY
        Pause the thread for every process: it keeps accepting signals, no run starts, and
        an active run is handed no further signal (the one in hand finishes).
    resume THREAD_KEY
        Resume a paused thread: its signals go on in order.
    schedules
        Every schedule: id, thread, every / cron (and time zone), catch-up, next tick.
    unschedule SCHEDULE_ID
        Remove a schedule and its pending tick.

Options of every command: --redis-url URL (default: $REDIS_URL); --cluster when that URL is
a seed node of a Redis Cluster; --key-prefix P, the key_prefix of the RedisStreamsPubSub the
runtime runs on (default "pubsub": leases under P:lease, store under P:signals);
--lease-prefix / --inbox-prefix override those two when you built a RedisLeaseProvider /
RedisSignalStore yourself; --json prints JSON instead of text (tail: one JSON object per
line).

Exit codes::

    0    ok (an empty listing too; tail stopped by Ctrl-C / SIGINT)
    1    usage error: bad arguments, no Redis URL, a malformed URL
    2    Redis unreachable: connection refused or lost, timeout (one line on stderr)
    3    nothing found or nothing to act on: no such receipt, cancel withdrew none of the
         ids, abort found no such active run, tail's cursor is older than the stream retains
    4    Redis refused the request: wrong password, missing ACL permission, wrong database
         (one line on stderr)
    130  interrupted by Ctrl-C (every command but tail)
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import NoReturn

from _signal_leases.validation import check_identifier, check_str

__all__ = ["DEFAULT_KEY_PREFIX", "EXIT_USAGE", "build_parser", "check_args"]

DEFAULT_KEY_PREFIX = "pubsub"
"""The default ``key_prefix`` of ``RedisStreamsPubSub``."""

EXIT_USAGE = 1  # a usage error (exit code 2 always means "Redis unreachable")

_CURSOR = re.compile(r"\d+(-\d+)?")


class _Parser(argparse.ArgumentParser):
    """Usage errors exit 1, so that exit code 2 always means "Redis unreachable"."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m signals``."""
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    details = (__doc__ or "").partition("\n\n")[2]
    parser = _Parser(
        prog="signals" if script == "signals" else "python -m signals",
        description="See and control signal-runtime threads on Redis.",
        epilog=details.replace("::\n", ":\n").replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common = _Parser(add_help=False)
    common.add_argument("--redis-url", default=os.environ.get("REDIS_URL"),
                        help="Redis URL, e.g. redis://127.0.0.1:6379/0 (default: $REDIS_URL)")
    common.add_argument("--cluster", action="store_true",
                        help="--redis-url is a seed node of a Redis Cluster")
    common.add_argument("--key-prefix", default=DEFAULT_KEY_PREFIX,
                        help="key_prefix of the RedisStreamsPubSub (default: %(default)s)")
    common.add_argument("--lease-prefix", default=None,
                        help="lease key prefix (default: <key-prefix>:lease)")
    common.add_argument("--inbox-prefix", default=None,
                        help="inbox key prefix (default: <key-prefix>:signals)")
    common.add_argument("--json", action="store_true", help="print JSON instead of text")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=_Parser)

    def command(name: str, text: str, *, key: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=text, description=text)
        if key:
            p.add_argument("thread_key", metavar="THREAD_KEY")
        return p

    p = command("threads", "every thread of the deployment: owner, pending, activity", key=False)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--active", action="store_true", help="only threads with an owner")
    which.add_argument("--idle", action="store_true", help="only threads without an owner")
    p.add_argument("--limit", type=int, default=100, help="list at most N threads (default: 100)")
    p = command("inspect", "lease and queued signals of one thread")
    p.add_argument("--limit", type=int, default=10,
                   help="show the first N queued signals (default: 10)")
    command("pending", "signals of one thread accepted and not yet acknowledged")
    p = command("cancel", "withdraw queued signals no run has taken yet")
    p.add_argument("signal_ids", nargs="+", metavar="ID")
    p = command("abort", "cancel the active run of one thread")
    p.add_argument("--run", default=None, help="abort only this run id")
    p.add_argument("--clear", action="store_true", help="also withdraw every pending signal")
    p.add_argument("--reason", default=None, metavar="TEXT",
                   help="the run reports 'abort: TEXT'")
    p = command("tail", "print the output stream of one thread, following it live")
    p.add_argument("--after", default=None, metavar="CURSOR", help="start after this cursor")
    p.add_argument("--no-follow", action="store_true", help="stop at the current end")
    p = command("receipt", "what became of one signal")
    p.add_argument("signal_id", metavar="SIGNAL_ID")
    p = command("dead-letters", "signals that failed max_attempts deliveries")
    action = p.add_mutually_exclusive_group()
    action.add_argument("--retry", nargs="+", default=[], metavar="ID",
                        help="put these dead letters back into the inbox")
    action.add_argument("--purge", action="store_true", help="delete every dead letter")
    command("pause", "pause one thread for every process (signals wait, no run starts)")
    command("resume", "resume a paused thread (its signals go on in order)")
    command("schedules", "every schedule: thread, period or cron, next tick", key=False)
    p = command("unschedule", "remove a schedule and its pending tick", key=False)
    p.add_argument("schedule_id", metavar="SCHEDULE_ID")
    return parser


def check_args(args: argparse.Namespace) -> None:
    """``ValueError`` for an argument the runtime would refuse (before connecting)."""
    if not args.redis_url:
        raise ValueError("--redis-url is required (or set $REDIS_URL)")
    if getattr(args, "thread_key", None) is not None:
        check_identifier("THREAD_KEY", args.thread_key)
    for name in ("signal_id", "run", "schedule_id"):
        if getattr(args, name, None) is not None:
            check_identifier(name.upper().replace("_", " "), getattr(args, name))
    for sid in [*getattr(args, "signal_ids", []), *getattr(args, "retry", [])]:
        check_identifier("signal id", sid)
    if getattr(args, "reason", None) is not None:
        check_str("--reason", args.reason)
    if getattr(args, "after", None) is not None and not _CURSOR.fullmatch(args.after):
        raise ValueError(f"--after {args.after!r} is not a stream cursor (like 1700000000000-0)")
    if getattr(args, "limit", 0) < 0:
        raise ValueError("--limit must be >= 0")
