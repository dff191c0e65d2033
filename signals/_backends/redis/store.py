"""``RedisSignalStore``: the durable store on Redis (accepted signals survive any crash).

Key layout: ``_signal_leases.keys.SignalKeys``; scripts: :mod:`signals._backends.redis.lua`. Each
store call is one round trip. Notices are Redis pub/sub messages, published from inside the
scripts, on ``<prefix>:notice:<runtime id>`` and ``<prefix>:work``; a runtime listens on one
connection for both, and after every reconnect hands its handler a ``resync`` notice.
On a Cluster the cross-thread index is updated in separate calls (see ``_redis_lua``).
The cross-thread parts (pending index, runtime registry, notices) are in
:mod:`signals._backends.redis.presence`.

Over 400 lines on purpose: one method per store call, each a thin wrapper around one Lua
script of ``_redis_lua``; the stream and dead-letter halves already live in their own modules.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Unpack

from _signal_leases.keys import SignalKeys
from _signal_leases.logs import get_logger
from _signal_leases.redis_support import (
    RedisHandle,
    RedisWriteOptions,
    as_int,
    map_errors,
    text,
)
from _signal_leases.validation import check_int, check_str
from signals._backends.redis.dead import RedisDeadLetters
from signals._backends.redis.lua import (
    ABORT,
    ACK,
    CANCEL,
    CLAIM_PENDING,
    DELIVER,
    READ,
    RELEASE_IF_IDLE,
    ROUTE,
    UNDELIVER,
)
from signals._backends.redis.output import RedisOutput
from signals._model import EntryMode, Receipt, Signal
from signals._store import (
    CARRY_LIMIT,
    Accepted,
    Ack,
    Claim,
    InboxEntry,
    InboxPage,
    Notice,
    Routed,
    decode_entry,
)

if TYPE_CHECKING:
    import redis.asyncio

    from _signal_leases.logs import Logger
    from leases import LeaseProvider

__all__ = ["RedisSignalStore"]

logger = get_logger("signals")

DAY_MS = 86_400_000


class RedisSignalStore(RedisOutput, RedisDeadLetters):
    """A durable :class:`~signals.SignalStore` on Redis.

    Give exactly one of ``url`` or ``client`` (only a client built from ``url`` is closed by
    :meth:`aclose`); the client options ``cluster``, ``socket_timeout`` (2 s),
    ``max_connections`` (32), ``wait_replicas`` and ``wait_timeout_ms`` are those of every
    Redis backend. ``leases``: the ``RedisLeaseProvider`` on the same Redis whose leases the
    fused calls read and grant (the runtime passes the one of its ``RedisStreamsPubSub``).
    ``retention_ms`` / ``max_receipts``: receipts (and the dedup window) per thread;
    ``idle_ttl_ms``: a thread nobody sends to for this long is dropped by Redis.
    ``stream_max_parts`` / ``stream_retention_ms``: what each thread's output stream keeps
    (default 10,000 parts, 24 h).

    ``wait_replicas=N`` (default 0: off) follows every scripted write (accept and route, so a
    signal is reported accepted only once ``N`` replicas have it; delivery, ack, claim,
    release, abort, cancel) with ``WAIT N wait_timeout_ms`` on the same connection, and
    raises :class:`BackendUnavailableError` when fewer replicas acknowledged in time (the
    write may still have been applied: resend with the same signal id). See docs/cluster.md.
    """

    def __init__(
        self,
        *,
        url: str | None = None,
        client: redis.asyncio.Redis | None = None,
        key_prefix: str = "signals",
        leases: LeaseProvider | None = None,
        retention_ms: int = DAY_MS,
        max_receipts: int = 10_000,
        idle_ttl_ms: int = 7 * DAY_MS,
        stream_max_parts: int = 10_000,
        stream_retention_ms: int = DAY_MS,
        **options: Unpack[RedisWriteOptions],
    ) -> None:
        check_str("key_prefix", key_prefix)
        self._handle = RedisHandle("RedisSignalStore", url=url, client=client, **options)
        self.client: redis.asyncio.Redis = self._handle.client
        self.key_prefix = key_prefix
        self.keys = SignalKeys(key_prefix)
        self.leases = leases
        self.retention_ms = check_int("retention_ms", retention_ms)
        self.max_receipts = check_int("max_receipts", max_receipts)
        self.idle_ttl_ms = check_int("idle_ttl_ms", idle_ttl_ms)
        self.stream_max_parts = check_int("stream_max_parts", stream_max_parts)
        self.stream_retention_ms = check_int("stream_retention_ms", stream_retention_ms)
        self._stream_cfg = f"{self.stream_max_parts}:{self.stream_retention_ms}"
        if self._handle.cluster:
            self._stream_cfg += ":1"  # announce new parts on sharded pub/sub (see the follower)
        self._idx = "0" if self._handle.cluster else "1"
        register = self.client.register_script
        self._route = register(ROUTE)
        self._read = register(READ)
        self._deliver = register(DELIVER)
        self._ack = register(ACK)
        self._release = register(RELEASE_IF_IDLE)
        self._claim = register(CLAIM_PENDING)
        self._abort = register(ABORT)
        self._cancel = register(CANCEL)
        self._undeliver = register(UNDELIVER)
        self._log: Logger = logger.bind()

    async def aclose(self) -> None:
        """Close the client if this store built it."""
        await self._handle.aclose()

    def _lease_keys(self) -> tuple[Any, str]:
        keys = getattr(self.leases, "keys", None)
        prefix = getattr(self.leases, "key_prefix", None)
        if keys is None or prefix is None:
            raise TypeError("fused calls need leases=RedisLeaseProvider(...) on the same Redis")
        return keys, f"{prefix}:session:"

    @asynccontextmanager
    async def _errors(self, what: str) -> AsyncIterator[None]:
        self._handle.require_asyncio()
        with map_errors(what):
            await self._handle.ready()
            yield

    async def _ready(self) -> None:
        await self._handle.ready()

    @asynccontextmanager
    async def _pipeline(self, what: str) -> AsyncIterator[Any]:
        """A pipeline (no transaction) whose errors are mapped as :meth:`_errors` does."""
        async with self._errors(what), self.client.pipeline(transaction=False) as pipe:
            yield pipe

    async def _script(self, script: Any, what: str, keys: list[str], args: list[Any]) -> Any:
        async with self._errors(what):
            if self._handle.wait_replicas:
                return (await self._handle.eval_many(self.client, script, [(keys, args)], what))[0]
            return await script(keys=keys, args=args)

    # -- inbox -----------------------------------------------------------------------------

    def _route_keys(self, thread_key: str, claim: Claim | None) -> list[str]:
        lease_keys, _ = self._lease_keys() if self.leases is not None else (None, "")
        k = self.keys
        keys = [k.thread(thread_key, "inbox"), k.thread(thread_key, "seen"),
                k.thread(thread_key, "receipts")]
        if lease_keys is not None:
            keys += [lease_keys.lease(thread_key), lease_keys.fence(thread_key)]
        else:
            keys += [k.thread(thread_key, "lease"), k.thread(thread_key, "fence")]  # unused
        if self._idx == "1":
            keys.append(k.pending_shard(thread_key))
            keys.append(k.runtime_threads(claim.runtime_id) if claim else keys[0])
        else:
            keys += [keys[0], keys[0]]  # not touched on a Cluster (idx '0')
        return [*keys, k.thread(thread_key, "attempts"), k.thread(thread_key, "meta"),
                k.thread(thread_key, "stream")]

    async def _do_route(
        self, thread_key: str, signal: Signal, mode: EntryMode, *, claim: Claim | None,
        sender: str | None, wake_workers: bool, index_only: bool,
    ) -> Routed:
        session_prefix = self._lease_keys()[1] if self.leases is not None else ""
        if claim is not None and self._idx == "0":  # Cluster: track before we can own it
            await self.track_threads(claim.runtime_id, add=[thread_key])
        args = [
            session_prefix, thread_key, signal.id, signal.encode(), mode, self.retention_ms,
            self.max_receipts, self.idle_ttl_ms,
            claim.owner if claim else "", claim.ttl_ms if claim else 0,
            (claim.session or "") if claim else "", sender or "", self.keys.notice_prefix,
            self.keys.work_channel, "1" if wake_workers else "0", self._idx,
            "1" if index_only else "0", self._stream_cfg, CARRY_LIMIT,
        ]
        reply = await self._script(
            self._route, f"send to thread {thread_key!r}", self._route_keys(thread_key, claim), args
        )
        fresh, entry_id, receipt, owner, claimed, token, *carried = reply
        routed = Routed(
            fresh=as_int(fresh) == 1,
            entry_id=text(entry_id) if entry_id else None,
            receipt=_receipt(signal.id, receipt) if receipt else None,
            owner=text(owner) if owner else None,
            claimed=as_int(claimed) == 1,
            token=as_int(token) if token else None,
            carried=bool(carried) and as_int(carried[0]) == 1,
        )
        if (self._idx == "0" and _to_index(routed) and routed.owner is None
                and not routed.claimed):
            await self._index([thread_key])
            if wake_workers:
                await self.notify(None, Notice("work", thread_key))
        return routed

    async def accept(self, thread_key: str, signal: Signal, mode: EntryMode) -> Accepted:
        routed = await self._do_route(
            thread_key, signal, mode, claim=None, sender=None, wake_workers=False, index_only=True
        )
        if self._idx == "0" and _to_index(routed):
            await self._index([thread_key])
        return Accepted(routed.fresh, routed.entry_id, routed.receipt)

    def _delivery_keys(self, thread_key: str) -> tuple[list[str], str]:
        k = self.keys
        keys = [k.thread(thread_key, p) for p in ("inbox", "attempts", "receipts", "dead")]
        keys.append(k.pending_shard(thread_key) if self._idx == "1" else keys[0])
        lease, session_prefix = self._fence(thread_key)
        keys += [lease, k.thread(thread_key, "stream"), k.thread(thread_key, "meta")]
        return keys, session_prefix

    async def read(
        self, thread_key: str, *, after: str | None = None, limit: int = 100,
        max_bytes: int = 1 << 20, deliver_to: str | None = None, max_attempts: int = 5,
        skip_queued: bool = False,
    ) -> InboxPage:
        start = "-" if after is None else f"({after}"
        keys, session_prefix = self._delivery_keys(thread_key)
        args = [start, limit, max_bytes, deliver_to or "", max_attempts, thread_key, self._idx,
                session_prefix, "1" if skip_queued else "0", self._stream_cfg]
        more, *rows = await self._script(self._read, "inbox read", keys, args)
        entries: list[InboxEntry] = []
        for raw_id, flat, attempts, delivered in rows:
            entry_id = text(raw_id)
            fields = {text(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}
            try:
                entries.append(
                    decode_entry(entry_id, fields["s"], text(fields.get("m", b"deliver")),
                                 as_int(attempts), as_int(delivered))
                )
            except (KeyError, TypeError, ValueError) as exc:
                # It could never be processed: drop it rather than block the thread.
                self._log.warning("signals.inbox_entry_dropped", key=thread_key,
                                  entry_id=entry_id, error=repr(exc))
                await self.client.xdel(keys[0], entry_id)
        return InboxPage.of(entries, as_int(more) == 1)

    async def deliver(
        self, thread_key: str, entry_id: str, signal_id: str, run_id: str, *, max_attempts: int
    ) -> int:
        keys, session_prefix = self._delivery_keys(thread_key)
        args = [entry_id, run_id, max_attempts, thread_key, self._idx, session_prefix,
                self._stream_cfg]
        return as_int(await self._script(self._deliver, "inbox delivery", keys, args))

    def _fence(self, thread_key: str) -> tuple[str, str]:
        """The lease key and session prefix the fenced scripts check ('' when unfenced)."""
        if self.leases is None:
            return self.keys.thread(thread_key, "inbox"), ""
        lease_keys, session_prefix = self._lease_keys()
        return lease_keys.lease(thread_key), session_prefix

    async def ack(self, thread_key: str, acks: Sequence[Ack]) -> bool:
        if not acks:
            return True
        return (await self.ack_and_deliver(thread_key, acks, None, max_attempts=0))[0]

    async def ack_and_deliver(
        self, thread_key: str, acks: Sequence[Ack], next_entry: str | None, *, max_attempts: int
    ) -> tuple[bool, int]:
        """``ack``, then deliver ``next_entry`` to the same run in the same step; returns
        (acknowledged, the delivery's result as ``deliver`` gives it, 0 with no entry)."""
        keys, session_prefix = self._delivery_keys(thread_key)
        args: list[Any] = [thread_key, self._idx, session_prefix, acks[0].run_id,
                           self._stream_cfg, next_entry or "", max_attempts]
        for a in acks:
            args += [a.entry_id, a.signal_id, a.result or ""]
        ok, delivered, *empty = await self._script(self._ack, "inbox ack", keys, args)
        if self._idx == "0" and empty and as_int(empty[0]) == 1:
            await self.unindex(thread_key)  # Cluster: after the ack (a crash leaves it indexed)
        return as_int(ok) == 1, as_int(delivered)

    async def note_failure(self, thread_key: str, signal_ids: Sequence[str], error: str) -> None:
        if signal_ids:
            async with self._errors("inbox note"):
                await self.client.hset(
                    self.keys.thread(thread_key, "attempts"),
                    mapping={f"e:{sid}": error[:2000] for sid in signal_ids},
                )

    async def undeliver(self, thread_key: str, run_id: str, entry_ids: Sequence[str]) -> None:
        """Take back the hand-out counted for each entry last delivered to ``run_id``: the run
        read it ahead but never handed it to its agent (see ``Run.give_back``)."""
        if entry_ids:
            await self._script(self._undeliver, "inbox undelivery",
                               [self.keys.thread(thread_key, "attempts")], [run_id, *entry_ids])

    async def pending_count(self, thread_key: str) -> int:
        async with self._errors("inbox count"):
            return int(await self.client.xlen(self.keys.thread(thread_key, "inbox")))

    async def receipt(self, thread_key: str, signal_id: str) -> Receipt | None:
        k = self.keys
        async with self._pipeline("receipt read") as pipe:
            pipe.zscore(k.thread(thread_key, "seen"), signal_id)
            pipe.hget(k.thread(thread_key, "receipts"), signal_id)
            score, raw = await pipe.execute()
        if raw is None or score is None or float(score) < time.time() * 1000 - self.retention_ms:
            return None
        return _receipt(signal_id, raw)

    # -- dead letters ----------------------------------------------------------------------

    # -- fused calls -----------------------------------------------------------------------

    def fuses_with(self, leases: LeaseProvider) -> bool:
        """True for the lease provider this store was built with (same Redis, same keys)."""
        return self.leases is not None and leases is self.leases

    async def route(
        self, thread_key: str, signal: Signal, mode: EntryMode, *, claim: Claim | None,
        sender: str | None, wake_workers: bool,
    ) -> Routed:
        return await self._do_route(
            thread_key, signal, mode, claim=claim, sender=sender, wake_workers=wake_workers,
            index_only=False,
        )

    async def release_if_idle(self, thread_key: str, owner: str, runtime_id: str) -> bool:
        lease_keys, _ = self._lease_keys()
        keys = [lease_keys.lease(thread_key), self.keys.thread(thread_key, "inbox")]
        keys.append(self.keys.runtime_threads(runtime_id) if self._idx == "1" else keys[1])
        reply = await self._script(self._release, f"release of thread {thread_key!r}", keys,
                                   [owner, thread_key, self._idx])
        released = as_int(reply) == 1
        if released and self._idx == "0":
            await self.track_threads(runtime_id, remove=[thread_key])
        return released

    async def claim_pending(self, thread_key: str, claim: Claim) -> Routed:
        lease_keys, session_prefix = self._lease_keys()
        if self._idx == "0":
            await self.track_threads(claim.runtime_id, add=[thread_key])
        keys = [lease_keys.lease(thread_key), lease_keys.fence(thread_key),
                self.keys.thread(thread_key, "inbox")]
        keys += ([self.keys.pending_shard(thread_key), self.keys.runtime_threads(claim.runtime_id)]
                 if self._idx == "1" else [keys[2], keys[2]])
        keys.append(self.keys.thread(thread_key, "meta"))
        args = [session_prefix, thread_key, claim.owner, claim.ttl_ms, claim.session or "",
                self._idx]
        code, owner, token, *left = await self._script(
            self._claim, f"claim of thread {thread_key!r}", keys, args
        )
        code = as_int(code)
        if self._idx == "0" and code in (1, 2):
            await self.unindex(thread_key)  # Cluster: after the claim (tracked before it)
        elif self._idx == "0" and code == 0:
            await self.defer(thread_key, as_int(left[0]) if left else claim.ttl_ms)
        if code == 1:
            return Routed(owner=claim.owner, claimed=True, token=as_int(token))
        if code == 0:
            return Routed(owner=text(owner))
        return Routed(empty=code == 2)


    # -- control: abort and cancel -----------------------------------------------------------

    def _control_keys(self, thread_key: str) -> tuple[list[str], str]:
        k = self.keys
        lease, session_prefix = self._fence(thread_key)
        keys = [lease, *(k.thread(thread_key, p) for p in ("inbox", "attempts", "receipts",
                                                            "stream", "meta"))]
        keys.append(k.pending_shard(thread_key) if self._idx == "1" else keys[1])
        return keys, session_prefix

    async def abort(
        self, thread_key: str, run_id: str | None, *, reason: str, clear: bool
    ) -> str | None:
        """Abort ``run_id`` (default: the live owner) if it holds the thread; see the
        contract. Returns the aborted run id or ``None``."""
        keys, session_prefix = self._control_keys(thread_key)
        args = [session_prefix, run_id or "", reason, "1" if clear else "0",
                self.keys.notice_prefix, thread_key, self._idx, self._stream_cfg]
        run = await self._script(self._abort, f"abort on thread {thread_key!r}", keys, args)
        return text(run) if run else None

    async def cancel(
        self, thread_key: str, signal_ids: Sequence[str], *, in_flight_run: str | None = None
    ) -> list[str]:
        """Withdraw pending signals no live run holds; returns the ids withdrawn."""
        if not signal_ids:
            return []
        keys, session_prefix = self._control_keys(thread_key)
        args = [session_prefix, in_flight_run or "", thread_key, self._idx, self._stream_cfg,
                *signal_ids]
        removed = await self._script(self._cancel, f"cancel on thread {thread_key!r}", keys, args)
        return [text(s) for s in removed]

    async def thread_meta(self, thread_keys: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Per thread: ``since``, ``last`` (Unix times, when known), ``abort`` (the last run
        asked to abort) and ``pending`` (inbox length)."""
        async with self._pipeline("thread info read") as pipe:
            for t in thread_keys:
                pipe.hgetall(self.keys.thread(t, "meta"))
                pipe.xlen(self.keys.thread(t, "inbox"))
            replies = await pipe.execute()
        out: dict[str, dict[str, Any]] = {}
        for i, thread in enumerate(thread_keys):
            raw = {text(k): text(v) for k, v in (replies[2 * i] or {}).items()}
            out[thread] = {
                "since": float(raw["since"]) if "since" in raw else None,
                "last": float(raw["last"]) if "last" in raw else None,
                "abort": raw.get("abort"),
                "pending": int(replies[2 * i + 1]),
            }
        return out


def _receipt(signal_id: str, raw: Any) -> Receipt:
    obj = json.loads(raw)
    return Receipt.from_dict(signal_id, obj)


def _to_index(routed: Routed) -> bool:
    """On a Cluster the pending index (another slot) is written after the inbox: a fresh entry
    is indexed, and so is a duplicate still pending, since its first sender may have died
    between the two writes (``ZADD NX``: indexing twice is harmless)."""
    return routed.fresh or (routed.receipt is not None and routed.receipt.status == "pending")
