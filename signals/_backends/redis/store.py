"""``RedisSignalStore``: the durable core on Redis (accepted signals survive any crash).

Key layout: ``_signal_leases.keys.SignalKeys``; scripts: :mod:`signals._backends.redis.lua`
(one script, one round trip, per core call). It has every optional capability: notices are
Redis pub/sub messages published from inside the scripts, on ``<prefix>:notice:<runtime
id>`` and ``<prefix>:work``; the runtime registry and the pending index are in ``presence``;
output streams and their follower in ``output``; and with the ``RedisLeaseProvider`` of the
same Redis, the fused calls (a routed signal costs two round trips: route, then ack).

On a Cluster the cross-thread index (another slot) is updated in a separate call after the
per-thread script, in a crash-safe order (see ``lua``'s module docstring).

Over 400 lines on purpose: one method per core call, each a thin wrapper around one script.
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
from signals._backends.redis.fused import RedisFused
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
from signals._backends.redis.output import RedisOutput
from signals._backends.redis.presence import RedisPresence
from signals._model import EntryMode, Receipt, Signal
from signals.kit._capabilities import CARRY_LIMIT
from signals.kit._core import (
    NO_LIMITS,
    Accepted,
    Ack,
    DeadLetter,
    InboxEntry,
    Limits,
    RunRef,
    Taken,
    ThreadState,
    decode_entry,
)

if TYPE_CHECKING:
    import redis.asyncio

    from _signal_leases.logs import Logger
    from leases import LeaseProvider

__all__ = ["RedisSignalStore"]

logger = get_logger("signals")

DAY_MS = 86_400_000
_KEY_CACHE = 4096  # threads whose script keys are kept built


def _ms(seconds: float | None) -> str:
    return "" if seconds is None else str(int(seconds * 1000))


class RedisSignalStore(RedisOutput, RedisPresence, RedisFused):
    """A durable :class:`~signals.kit.SignalCore` on Redis, with every capability.

    Give exactly one of ``url`` or ``client`` (only a client built from ``url`` is closed by
    :meth:`aclose`); the client options ``cluster``, ``socket_timeout`` (2 s),
    ``max_connections`` (32), ``wait_replicas`` and ``wait_timeout_ms`` are those of every
    Redis backend. ``leases``: the ``RedisLeaseProvider`` on the same Redis whose leases the
    fused calls read and grant (the runtime passes the one of its ``RedisStreamsPubSub``).
    ``retention_ms`` / ``max_receipts``: receipts (and the dedup window) per thread;
    ``idle_ttl_ms``: a thread nobody sends to for this long is dropped by Redis.
    ``stream_max_parts`` / ``stream_retention_ms``: what each thread's output stream keeps
    (default 10,000 parts, 24 h).

    ``wait_replicas=N`` (default 0: off) follows every scripted write with ``WAIT N
    wait_timeout_ms`` on the same connection, and raises :class:`BackendUnavailableError`
    when fewer replicas acknowledged in time (the write may still have been applied: resend
    with the same signal id). See docs/cluster.md.
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
        # New parts are announced for the follower: sharded pub/sub on a Cluster (":1"),
        # plain pub/sub on one Redis (":2"); see ``follower``.
        self._stream_cfg = (f"{self.stream_max_parts}:{self.stream_retention_ms}:"
                            f"{'1' if self._handle.cluster else '2'}")
        self._idx = "0" if self._handle.cluster else "1"
        self._key_cache: dict[str, list[str]] = {}  # thread key -> its script keys (bounded)
        register = self.client.register_script
        self._lua = {name: register(src) for name, src in (
            ("accept", ACCEPT), ("take", TAKE), ("settle", SETTLE), ("withdraw", WITHDRAW),
            ("look_at", LOOK_AT), ("pause", PAUSE), ("revive", REVIVE), ("claim", CLAIM),
            ("release", RELEASE_IF_IDLE), ("abort", ABORT),
        )}
        self._log: Logger = logger.bind()

    async def aclose(self) -> None:
        """Close the client if this store built it."""
        await self._handle.aclose()

    def _session_prefix(self) -> str:
        prefix = getattr(self.leases, "key_prefix", None)
        return "" if self.leases is None or prefix is None else f"{prefix}:session:"

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
            lease_keys = getattr(self.leases, "keys", None)
            if lease_keys is not None:
                keys += [lease_keys.lease(thread_key), lease_keys.fence(thread_key)]
            else:
                keys += [k.thread(thread_key, "lease"), k.thread(thread_key, "fence")]  # unused
            keys.append(k.pending_shard(thread_key) if self._idx == "1" else keys[0])
            if len(self._key_cache) >= _KEY_CACHE:  # bounded: the oldest entry goes
                del self._key_cache[next(iter(self._key_cache))]
            self._key_cache[thread_key] = keys
        if self._idx == "1":
            return [*keys, self.keys.runtime_threads(runtime_id) if runtime_id else keys[0]]
        return [*keys, keys[0]]  # Cluster: not touched (another slot)

    def _header(self, thread_key: str) -> list[Any]:
        return [thread_key, self._idx, self._session_prefix(), self._stream_cfg,
                self.retention_ms, self.max_receipts, self.idle_ttl_ms]

    async def _run(self, name: str, thread_key: str, args: Sequence[Any], what: str, *,
                   runtime_id: str | None = None) -> list[Any]:
        script = self._lua[name]
        keys = self._keys(thread_key, runtime_id)
        argv = [*self._header(thread_key), *args]
        async with self._errors(what):
            if self._handle.wait_replicas:
                reply = (await self._handle.eval_many(self.client, script, [(keys, argv)],
                                                      what))[0]
            else:
                reply = await script(keys=keys, args=argv)
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

    # -- the core ---------------------------------------------------------------------------

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
            rec = _receipt(signal.id, receipt) if receipt else None
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

    async def accept(
        self, thread_key: str, signal: Signal, mode: EntryMode, *, limits: Limits = NO_LIMITS
    ) -> Accepted:
        args = [*self._accept_args(signal, mode, limits), "0", "", 0, "", "", "", "", "0",
                CARRY_LIMIT]
        reply = await self._run("accept", thread_key, args, f"send to thread {thread_key!r}")
        accepted, _ = self._accepted(signal, reply)
        if self._idx == "0" and accepted.outcome == "duplicate" and accepted.receipt is not None \
                and accepted.receipt.status in ("pending", "scheduled"):
            await self._apply_index(thread_key, "a", time.time() * 1000)  # see _redo_index
        return accepted

    async def take(
        self, thread_key: str, run: RunRef, *, acks: Sequence[Ack] = (), max_attempts: int,
        first: bool = False,
    ) -> Taken:
        args: list[Any] = [run.run_id, "" if run.token is None else run.token, max_attempts,
                           "1" if first else "0"]
        for a in acks:
            args += [a.entry_id, a.signal_id, a.result or ""]
        status, rows, more, due, dead, *rest = await self._run("take", thread_key, args,
                                                                "inbox take")
        status = text(status)
        if status == "fenced":
            return Taken(fenced=True)
        entries = []
        for number, body, mode, attempts, state in rows:
            entries.append(self._entry(thread_key, str(as_int(number)), body, mode, attempts,
                                       text(state)))
        return Taken(
            tuple(e for e in entries if e is not None), paused=status == "paused",
            stopped=status == "stopped", more=as_int(more) == 1,
            next_due=float(text(due)) / 1000 if due else None,
            dead=tuple(text(d) for d in dead), pending=as_int(rest[0]) if rest else None,
        )

    def _entry(self, thread_key: str, entry_id: str, body: Any, mode: Any, attempts: Any,
               state: str, holder: str | None = None, due: float | None = None
               ) -> InboxEntry | None:
        try:
            return decode_entry(entry_id, body, text(mode), as_int(attempts),
                                state=state, holder=holder, due_at=due)  # type: ignore[arg-type]
        except (KeyError, TypeError, ValueError) as exc:
            self._log.warning("signals.inbox_entry_dropped", key=thread_key, entry_id=entry_id,
                              error=repr(exc))
            return None

    async def settle(
        self, thread_key: str, run: RunRef, *, acks: Sequence[Ack] = (),
        failed: Sequence[str] = (), returned: Sequence[str] = (), error: str | None = None,
    ) -> bool:
        args: list[Any] = [run.run_id, "" if run.token is None else run.token,
                           (error or "")[:2000], len(acks), len(failed)]
        for a in acks:
            args += [a.entry_id, a.signal_id, a.result or ""]
        args += [*failed, *returned]
        [ok] = await self._run("settle", thread_key, args, "inbox settle")
        return as_int(ok) == 1

    async def withdraw(
        self, thread_key: str, signal_ids: Sequence[str] | None, *, held: bool = False,
        run_id: str = "",
    ) -> list[str]:
        if signal_ids is not None and not signal_ids:
            return []
        args = ["1" if held else "0", run_id, *(signal_ids or ())]
        [removed] = await self._run("withdraw", thread_key, args,
                                    f"cancel on thread {thread_key!r}")
        return [text(s) for s in removed]

    async def entries(
        self, thread_key: str, *, limit: int = 100, offset: int = 0
    ) -> list[InboxEntry]:
        k = self.keys
        async with self._pipeline("inbox read") as pipe:
            pipe.hgetall(k.thread(thread_key, "em"))
            pipe.hgetall(k.thread(thread_key, "eb"))
            metas, bodies = await pipe.execute()
        rows = []
        for raw_seq, raw_meta in metas.items():
            seq = text(raw_seq)
            meta = json.loads(raw_meta)
            body = bodies.get(raw_seq)
            if body is None:
                continue
            rows.append((-int(meta.get("p", 0)), int(seq), seq, meta, body))
        rows.sort()
        out = []
        for _, _, seq, meta, body in rows[offset: offset + limit]:
            due = meta.get("d")
            entry = self._entry(thread_key, seq, body, meta.get("m", "deliver"), meta.get("n", 0),
                                meta.get("st", "ready"), meta.get("h"),
                                due / 1000 if due is not None else None)
            if entry is not None:
                out.append(entry)
        return out

    async def receipt(self, thread_key: str, signal_id: str) -> Receipt | None:
        k = self.keys
        async with self._pipeline("receipt read") as pipe:
            pipe.zscore(k.thread(thread_key, "seen"), signal_id)
            pipe.hget(k.thread(thread_key, "receipts"), signal_id)
            score, raw = await pipe.execute()
        if raw is None or score is None or float(score) < time.time() * 1000 - self.retention_ms:
            return None
        return _receipt(signal_id, raw)

    async def look_at(self, thread_key: str, at: float) -> None:
        await self._run("look_at", thread_key, [int(at * 1000)], "pending index update")

    async def pause(self, thread_key: str, paused: bool) -> bool:
        [was] = await self._run("pause", thread_key, ["1" if paused else "0"],
                                f"pause of thread {thread_key!r}")
        return as_int(was) == 1

    async def describe(self, thread_keys: Sequence[str]) -> dict[str, ThreadState]:
        k = self.keys
        async with self._pipeline("thread info read") as pipe:
            for t in thread_keys:
                pipe.hgetall(k.thread(t, "meta"))
                pipe.hlen(k.thread(t, "em"))
                pipe.zcard(k.thread(t, "rq"))
                pipe.hlen(k.thread(t, "hd"))
                pipe.zrange(k.thread(t, "lt"), 0, 0, withscores=True)
            replies = await pipe.execute()
        out: dict[str, ThreadState] = {}
        now_ms = time.time() * 1000
        for i, thread in enumerate(thread_keys):
            meta, pending, ready, held, first = replies[5 * i: 5 * i + 5]
            raw = {text(a): text(b) for a, b in (meta or {}).items()}
            due_ms = float(first[0][1]) if first else None
            out[thread] = ThreadState(
                pending=int(pending),
                ready=int(ready) > 0 or int(held) > 0 or (due_ms is not None and due_ms <= now_ms),
                paused=raw.get("paused") == "1",
                last=float(raw["last"]) if "last" in raw else None,
                since=float(raw["since"]) if "since" in raw else None,
                run=raw.get("run"), next_due=due_ms / 1000 if due_ms is not None else None,
                abort=raw.get("abort"),
            )
        return out

    async def dead_letters(self, thread_key: str, *, limit: int = 100) -> list[DeadLetter]:
        async with self._errors("dead-letter read"):
            raw: Any = await self.client.hgetall(self.keys.thread(thread_key, "dead"))
        out = []
        for value in raw.values():
            obj = json.loads(value)
            signal = Signal.from_dict(json.loads(obj["s"]), mode=obj.get("m", "deliver"))
            out.append(DeadLetter(signal, int(obj["n"]), obj.get("e") or None, float(obj["at"])))
        return sorted(out, key=lambda d: d.at)[:limit]

    async def revive(
        self, thread_key: str, signal_ids: Sequence[str] | None, *, purge: bool = False
    ) -> list[str]:
        if signal_ids is not None and not signal_ids:
            return []
        [found] = await self._run("revive", thread_key, ["1" if purge else "0",
                                                         *(signal_ids or ())],
                                  "dead-letter retry")
        return [text(s) for s in found]


def _receipt(signal_id: str, raw: Any) -> Receipt:
    obj = json.loads(raw)
    return Receipt.from_dict(signal_id, obj)

