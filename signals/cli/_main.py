"""The ``signals`` command (the same as ``python -m signals``): see and control threads. The
commands and their options are described in :mod:`signals.cli._args` (and by ``--help``)."""


# One small handler per command; the arguments and the command-line reference (the epilog of
# --help) are in _args, the text formatting in _format.

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

import anyio

import signals.cli._format as fmt
from _signal_leases.errors import BackendPermanentError, BackendUnavailableError, CursorExpiredError
from signals.cli._args import DEFAULT_KEY_PREFIX, EXIT_USAGE, build_parser, check_args

if TYPE_CHECKING:
    from collections.abc import Sequence

    from anyio import CancelScope
    from anyio.abc import TaskStatus

    from signals._runtime import SignalRuntime

__all__ = ["DEFAULT_KEY_PREFIX", "Prefixes", "build_parser", "main"]

EXIT_OK = 0
EXIT_UNAVAILABLE = 2
EXIT_NOT_FOUND = 3
EXIT_REFUSED = 4
EXIT_INTERRUPTED = 130

_redact = fmt.redact


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


def _say(args: argparse.Namespace, out: TextIO, data: Any, text: str) -> None:
    print(json.dumps(data) if args.json else text, file=out)


def _complain(message: str) -> None:
    print(message, file=sys.stderr)


# -- the commands (each returns its exit code) ------------------------------------------------


async def _threads(rt: SignalRuntime, args: argparse.Namespace, out: TextIO) -> int:
    active = True if args.active else False if args.idle else None
    found = (await rt.threads(active=active))[: args.limit]
    _say(args, out, fmt.threads_json(found), fmt.threads_text(found, active))
    return EXIT_OK


async def _inspect(rt: SignalRuntime, args: argparse.Namespace, out: TextIO) -> int:
    key = args.thread_key
    lease_info = getattr(rt.leases, "lease_info", None)  # not part of the LeaseProvider API
    if callable(lease_info):
        info = await lease_info(key)
        lease = None if info is None else {
            "owner": info.owner, "ttl_ms": info.ttl_ms_remaining, "token": info.token
        }
    else:
        owner = await rt.leases.get_lease_owner(key)
        lease = None if owner is None else {"owner": owner, "ttl_ms": None, "token": None}
    count = (await rt.store.describe([key]))[key].pending
    entries = await rt.store.entries(key, limit=args.limit) if args.limit else []
    report = {
        "thread_key": key,
        "lease": lease,
        "pending_count": count,
        "signals": [
            {"entry_id": e.entry_id, "id": e.signal.id, "type": e.signal.type, "mode": e.mode,
             "attempts": e.attempts, "created_at": e.signal.created_at}
            for e in entries
        ],
    }
    _say(args, out, report, fmt.inspect_text(report))
    return EXIT_OK


async def _pending(rt: SignalRuntime, args: argparse.Namespace, out: TextIO) -> int:
    signals = await rt.pending(args.thread_key)
    _say(args, out, fmt.pending_json(args.thread_key, signals),
         fmt.pending_text(args.thread_key, signals))
    return EXIT_OK


async def _cancel(rt: SignalRuntime, args: argparse.Namespace, out: TextIO) -> int:
    wanted = list(dict.fromkeys(args.signal_ids))
    withdrawn = await rt.cancel(args.thread_key, wanted)
    missed = [s for s in wanted if s not in withdrawn]
    report = {"thread_key": args.thread_key, "cancelled": withdrawn, "not_cancelled": missed}
    if args.json or withdrawn:
        _say(args, out, report, "\n".join(withdrawn))
    if missed:
        _complain(f"not cancelled (unknown, held by a run, or already done): {' '.join(missed)}")
    return EXIT_OK if withdrawn else EXIT_NOT_FOUND


async def _abort(rt: SignalRuntime, args: argparse.Namespace, out: TextIO) -> int:
    key, run = args.thread_key, args.run
    aborted = await rt.abort(key, run, clear_pending=args.clear, reason=args.reason)
    which = f"run {run}" if run else "the active run"
    report = {"thread_key": key, "run_id": run, "aborted": aborted,
              "clear_pending": args.clear, "reason": args.reason}
    if args.json or aborted:
        cleared = "; its pending signals were withdrawn" if args.clear else ""
        _say(args, out, report,
             f"aborted {which} of {key!r} (it stops at its next checkpoint){cleared}")
    if not aborted:
        _complain(f"no active run to abort on {key!r}" + (f" (not {run})" if run else ""))
    return EXIT_OK if aborted else EXIT_NOT_FOUND


async def _tail(rt: SignalRuntime, args: argparse.Namespace, out: TextIO) -> int:
    line = fmt.part_json if args.json else fmt.part_text
    async with anyio.create_task_group() as tg:
        await tg.start(_stop_on_sigint, tg.cancel_scope)
        async for part in rt.stream(args.thread_key, after=args.after, follow=not args.no_follow):
            print(line(part), file=out, flush=True)
        tg.cancel_scope.cancel()
    return EXIT_OK


async def _stop_on_sigint(
    scope: CancelScope, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    """Cancel ``scope`` on SIGINT (where signal handlers cannot be installed, Ctrl-C raises
    ``KeyboardInterrupt`` instead, which ``main`` turns into the same quiet exit)."""
    try:
        with anyio.open_signal_receiver(signal.SIGINT) as received:
            task_status.started()
            async for _ in received:
                scope.cancel()
                return
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, Windows
        task_status.started()
        await anyio.sleep_forever()


async def _receipt(rt: SignalRuntime, args: argparse.Namespace, out: TextIO) -> int:
    receipt = await rt.receipt(args.thread_key, args.signal_id)
    if receipt is None:
        _complain(f"no receipt for {args.signal_id!r} on {args.thread_key!r}")
        return EXIT_NOT_FOUND
    found = fmt.receipt_json(receipt)
    _say(args, out, found, fmt.receipt_text(found))
    return EXIT_OK


async def _dead_letters(rt: SignalRuntime, args: argparse.Namespace, out: TextIO) -> int:
    key = args.thread_key
    retried = await rt.retry_dead_letters(key, args.retry) if args.retry else []
    purged = await rt.purge_dead_letters(key) if args.purge else 0
    report = fmt.dead_letters_json(key, await rt.dead_letters(key, limit=1000), retried, purged)
    _say(args, out, report, fmt.dead_letters_text(report))
    return EXIT_OK


async def _pause(rt: SignalRuntime, args: argparse.Namespace, out: TextIO) -> int:
    key, pausing = args.thread_key, args.command == "pause"
    was = await (rt.pause(key) if pausing else rt.resume(key))
    if pausing:
        text = f"{key!r} was already paused" if was else f"paused {key!r}"
    else:
        text = f"resumed {key!r}" if was else f"{key!r} was not paused"
    _say(args, out, {"thread_key": key, "paused": pausing, "was_paused": was}, text)
    return EXIT_OK


async def _schedules(rt: SignalRuntime, args: argparse.Namespace, out: TextIO) -> int:
    found = [fmt.schedule_json(s) for s in await rt.schedules()]
    _say(args, out, {"schedules": found}, fmt.schedules_text(found))
    return EXIT_OK


async def _unschedule(rt: SignalRuntime, args: argparse.Namespace, out: TextIO) -> int:
    removed = await rt.unschedule(args.schedule_id)
    if not removed:
        _complain(f"no schedule {args.schedule_id!r}")
        return EXIT_NOT_FOUND
    _say(args, out, {"schedule_id": args.schedule_id, "removed": True},
         f"removed schedule {args.schedule_id!r}")
    return EXIT_OK


_Command = Callable[["SignalRuntime", argparse.Namespace, TextIO], Awaitable[int]]
_COMMANDS: dict[str, _Command] = {
    "threads": _threads, "inspect": _inspect, "pending": _pending, "cancel": _cancel,
    "abort": _abort, "tail": _tail, "receipt": _receipt, "dead-letters": _dead_letters,
    "pause": _pause, "resume": _pause, "schedules": _schedules, "unschedule": _unschedule,
}


async def _session(args: argparse.Namespace, out: TextIO) -> int:
    """Run one command on a sender-only runtime over ``RedisStreamsPubSub``."""
    from leases import RedisLeaseProvider
    from pubsub import RedisStreamsPubSub
    from signals._backends.redis.store import RedisSignalStore
    from signals._runtime import SignalRuntime

    try:
        pubsub = RedisStreamsPubSub(url=args.redis_url, key_prefix=args.key_prefix,
                                    cluster=args.cluster)
    except ValueError as exc:  # a malformed URL; the cause, without the URL (and password)
        reason = fmt.scrub(str(exc.__context__ or exc), args.redis_url)
        _complain(f"error: invalid Redis URL {_redact(args.redis_url)}: {reason}")
        return EXIT_USAGE
    leases: RedisLeaseProvider | None = None
    inbox: RedisSignalStore | None = None
    if args.lease_prefix or args.inbox_prefix:
        where = Prefixes.for_pubsub(
            args.key_prefix, lease=args.lease_prefix, inbox=args.inbox_prefix
        )
        leases = RedisLeaseProvider(client=pubsub.redis_client, key_prefix=where.lease)
        inbox = RedisSignalStore(client=pubsub.redis_client, key_prefix=where.inbox,
                                 leases=leases)
    async with pubsub, SignalRuntime(
        pubsub=pubsub, agent=None, leases=leases, inbox=inbox
    ) as runtime:
        return await _COMMANDS[args.command](runtime, args, out)


# -- arguments --------------------------------------------------------------------------------


# -- running ----------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``signals`` and ``python -m signals``; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_args(args)
    except (TypeError, ValueError) as exc:
        parser.error(str(exc))
    try:
        with fmt.logs_to_stderr():
            code: int = anyio.run(_session, args, sys.stdout, backend="asyncio")
    except BaseException as exc:
        found = _failure(exc, _redact(args.redis_url), tail=args.command == "tail")
        if found is None:
            raise
        code, message = found
        if message:
            _complain(" ".join(message.split()))  # one line
    return code


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` itself, or every exception inside an exception group."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


def _failure(exc: BaseException, url: str, *, tail: bool) -> tuple[int, str] | None:
    """The exit code and the stderr line for an expected failure, else ``None``."""
    import redis.exceptions as rex

    from _signal_leases.redis.support import is_permanent

    leaves = list(_leaves(exc))
    if any(isinstance(e, KeyboardInterrupt) for e in leaves):
        return (EXIT_OK if tail else EXIT_INTERRUPTED), ""
    for e in leaves:
        if isinstance(e, BrokenPipeError):  # the reader went away (`... | head`): stop quietly
            fmt.silence_stdout()
            return EXIT_OK, ""
        if isinstance(e, CursorExpiredError):
            return EXIT_NOT_FOUND, f"error: {e}"
        if isinstance(e, BackendPermanentError) or (
            isinstance(e, rex.RedisError) and is_permanent(e)
        ):
            return EXIT_REFUSED, f"error: Redis at {url} refused the request: {e}"
        if isinstance(e, BackendUnavailableError | rex.ConnectionError | rex.TimeoutError):
            return EXIT_UNAVAILABLE, f"error: cannot reach Redis at {url}: {e}"
    return None
