"""What every call of the Redis core shares: the client, the key layout, the scripts and how
one is called (its keys, its header, its errors), and the accept step's arguments and reply.

The base of :class:`~signals.RedisSignalStore` and of the sender
(:class:`~signals.RedisSignalSender`), so it imports neither anyio nor the store's other parts:
a process that only sends loads this, the scripts' text and the records it sends.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Unpack

from _signal_leases.keys import LeaseKeys, SignalKeys
from _signal_leases.logs import get_logger
from _signal_leases.redis.script import Script, run_script
from _signal_leases.redis.support import (
    RedisHandle,
    RedisWriteOptions,
    as_int,
    map_errors,
    text,
)
from _signal_leases.validation import check_int, check_str
from signals._backends.redis.lua import KEY_NAMES
from signals._backends.redis.lua_calls import (
    ABORT,
    ACCEPT,
    CLAIM,
    LOOK_AT,
    PAUSE,
    RELEASE_IF_IDLE,
    REVIVE,
    SETTLE,
    TAKE,
    WITHDRAW,
)
from signals._model import EntryMode, Receipt, Signal
from signals.kit._core import Accepted, Limits

if TYPE_CHECKING:
    import redis.asyncio

    from _signal_leases.logs import Logger

__all__ = ["DAY_MS", "InboxOptions", "RedisInbox"]

logger = get_logger("signals")

DAY_MS = 86_400_000
_KEY_CACHE = 4096  # threads whose script keys are kept built
#: What the core keeps per thread, by default (see :class:`InboxOptions`).
_KEPT: dict[str, int] = {"retention_ms": DAY_MS, "max_receipts": 10_000,
                         "idle_ttl_ms": 7 * DAY_MS, "stream_max_parts": 10_000,
                         "stream_retention_ms": DAY_MS}


class InboxOptions(RedisWriteOptions, total=False):
    """The client's options (those of every Redis backend) and what the core keeps per
    thread: ``retention_ms`` / ``max_receipts`` (receipts, the dedup window; 1 day, 10,000),
    ``idle_ttl_ms`` (7 days), ``stream_max_parts`` / ``stream_retention_ms`` (each thread's
    output stream; 10,000 parts, 1 day). A sender writes with the workers' values."""

    retention_ms: int
    max_receipts: int
    idle_ttl_ms: int
    stream_max_parts: int
    stream_retention_ms: int


def _ms(seconds: float | None) -> str:
    return "" if seconds is None else str(int(seconds * 1000))


class RedisInbox:
    """See the module docstring. ``lease_keys``: the key layout of the ``RedisLeaseProvider``
    whose leases the fused calls read and grant (``None``: no fused calls)."""

    def __init__(
        self,
        owner: str,
        *,
        url: str | None,
        client: redis.asyncio.Redis | None,
        key_prefix: str,
        lease_keys: LeaseKeys | None,
        **options: Unpack[InboxOptions],
    ) -> None:
        check_str("key_prefix", key_prefix)
        kept = {name: options.pop(name, default)  # type: ignore[misc]
                for name, default in _KEPT.items()}
        self._handle = RedisHandle(owner, url=url, client=client, **options)
        self.client: redis.asyncio.Redis = self._handle.client
        self.key_prefix = key_prefix
        self.keys = SignalKeys(key_prefix)
        # thread key -> its script keys (bounded: an OrderedDict, whose oldest item is found at
        # once; a dict would scan the slots its deletions left)
        self._key_cache: OrderedDict[str, list[str]] = OrderedDict()
        self._use_lease_keys(lease_keys)
        self.retention_ms = check_int("retention_ms", kept["retention_ms"])
        self.max_receipts = check_int("max_receipts", kept["max_receipts"])
        self.idle_ttl_ms = check_int("idle_ttl_ms", kept["idle_ttl_ms"])
        self.stream_max_parts = check_int("stream_max_parts", kept["stream_max_parts"])
        self.stream_retention_ms = check_int("stream_retention_ms",
                                             kept["stream_retention_ms"])
        # New parts are announced for the follower: sharded pub/sub on a Cluster (":1"),
        # plain pub/sub on one Redis (":2"); see ``follower``.
        self._stream_cfg = (f"{self.stream_max_parts}:{self.stream_retention_ms}:"
                            f"{'1' if self._handle.cluster else '2'}")
        self._idx = "0" if self._handle.cluster else "1"
        self._lua = {name: Script(self.client, src) for name, src in (
            ("accept", ACCEPT), ("take", TAKE), ("settle", SETTLE), ("withdraw", WITHDRAW),
            ("look_at", LOOK_AT), ("pause", PAUSE), ("revive", REVIVE), ("claim", CLAIM),
            ("release", RELEASE_IF_IDLE), ("abort", ABORT),
        )}
        self._log: Logger = logger.bind()

    def _use_lease_keys(self, lease_keys: LeaseKeys | None) -> None:
        """Read and grant the leases under ``lease_keys`` from now on."""
        self._lease_keys = lease_keys
        self._sessions = "" if lease_keys is None else f"{lease_keys.prefix}:session:"
        self._key_cache.clear()

    async def aclose(self) -> None:
        """Close the client if this object built it."""
        await self._handle.aclose()

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

    # -- calling a script -------------------------------------------------------------------

    def _keys(self, thread_key: str, runtime_id: str | None = None) -> list[str]:
        keys = self._key_cache.get(thread_key)
        if keys is None:
            k = self.keys
            keys = [k.thread(thread_key, name) for name in KEY_NAMES[:14]]
            lease_keys = self._lease_keys
            if lease_keys is not None:
                keys += [lease_keys.lease(thread_key), lease_keys.fence(thread_key)]
            else:
                keys += [k.thread(thread_key, "lease"), k.thread(thread_key, "fence")]  # unused
            keys.append(k.pending_shard(thread_key) if self._idx == "1" else keys[0])
            if len(self._key_cache) >= _KEY_CACHE:  # bounded: the oldest entry goes
                self._key_cache.popitem(last=False)
            self._key_cache[thread_key] = keys
        if self._idx == "1":
            return [*keys, self.keys.runtime_threads(runtime_id) if runtime_id else keys[0]]
        return [*keys, keys[0]]  # Cluster: not touched (another slot)

    def _header(self, thread_key: str) -> list[Any]:
        return [thread_key, self._idx, self._sessions, self._stream_cfg,
                self.retention_ms, self.max_receipts, self.idle_ttl_ms]

    async def _run(self, name: str, thread_key: str, args: Sequence[Any], what: str, *,
                   runtime_id: str | None = None) -> list[Any]:
        script = self._lua[name]
        keys = self._keys(thread_key, runtime_id)
        argv = [*self._header(thread_key), *args]
        reply = await run_script(self._handle, script, keys, argv, what)
        *out, ixop, ixscore = reply
        if self._idx == "0" and ixop:
            await self._apply_index(thread_key, text(ixop), float(text(ixscore)))
        return list(out)

    async def _apply_index(self, thread_key: str, op: str, score: float) -> None:
        """Cluster: the index change a script returned, in its own call."""
        shard = self.keys.pending_shard(thread_key)
        async with self._errors("pending index update"):
            if op == "a":
                await self.client.zadd(shard, {thread_key: score}, lt=True)
            elif op == "s":
                await self.client.zadd(shard, {thread_key: score})
            elif op == "r":
                await self.client.zrem(shard, thread_key)

    async def receipt(self, thread_key: str, signal_id: str) -> Receipt | None:
        k = self.keys
        async with self._pipeline("receipt read") as pipe:
            pipe.zscore(k.thread(thread_key, "seen"), signal_id)
            pipe.hget(k.thread(thread_key, "receipts"), signal_id)
            score, raw = await pipe.execute()
        if raw is None or score is None or float(score) < time.time() * 1000 - self.retention_ms:
            return None
        return receipt_of(signal_id, raw)

    # -- the accept step --------------------------------------------------------------------

    def _accept_args(self, signal: Signal, mode: EntryMode, limits: Limits) -> list[Any]:
        return [
            signal.id, signal.encode(), mode, signal.priority, signal.lane or "", signal.merge,
            signal.cache_key or "", "1" if signal.cache_key is not None else "0",
            _ms(signal.not_before), _ms(signal.expires_at),
            "" if signal.debounce_ms is None else signal.debounce_ms,
            "" if signal.max_wait_ms is None else signal.max_wait_ms,
            "" if limits.max_pending is None else limits.max_pending, limits.overflow,
        ]

    def _accepted(self, signal: Signal, reply: list[Any]) -> tuple[Accepted, list[Any]]:
        outcome, entry, receipt, reason, superseded, dropped, due, *rest = reply
        outcome = text(outcome)
        if outcome == "duplicate":
            rec = receipt_of(signal.id, receipt) if receipt else None
        elif outcome == "fresh":
            rec = Receipt(signal.id, text(receipt), at=time.time())  # type: ignore[arg-type]
        else:
            rec = None
        accepted = Accepted(
            outcome, str(as_int(entry)) if entry else None, rec,  # type: ignore[arg-type]
            text(reason) if reason else None, tuple(text(s) for s in superseded),
            tuple(text(s) for s in dropped), float(text(due)) / 1000 if due else None,
        )
        return accepted, rest


def receipt_of(signal_id: str, raw: Any) -> Receipt:
    """The :class:`Receipt` stored as JSON in a thread's receipts."""
    return Receipt.from_dict(signal_id, json.loads(raw))
