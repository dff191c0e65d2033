"""The cross-thread half of :class:`~signals.RedisSignalStore`: pending index, runtime
registry and notices (see ``_signal_leases.keys.SignalKeys`` for the key names).

* The pending index is sharded over ``SignalKeys.shards`` sorted sets (thread -> when to look
  at it next, in ms), so no single slot of a Cluster is hot. A thread a fused claim took leaves
  the index; its runtime's thread set names it instead, until that runtime's presence lapses
  and :meth:`RedisPresence.due` indexes its threads again.
* A runtime's presence is a hash with a TTL, refreshed by the runtime; the registry sorted set
  lists runtimes so that a dead one (presence gone) can be found and its threads indexed.
* Notices are pub/sub messages ``kind\nthread\nrun\nreason`` on ``<prefix>:notice:<runtime>``
  and ``<prefix>:work``; one connection per listening runtime, reconnected with backoff, and a
  ``resync`` notice after every (re)connect. On a Cluster, where ``PUBLISH`` reaches every
  node, that connection goes to one node (and moves after a failover).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Any

import anyio
import redis.exceptions

from _signal_leases.aio import checkpoint, loop_time, owned_task_group
from _signal_leases.errors import BackendError
from _signal_leases.redis.support import is_cluster, node_reader_client, refresh_slots, text
from signals._backends.redis.inbox import RedisInbox
from signals.kit._capabilities import Notice, RuntimeInfo
from signals.kit._core import Due, decode_entry

__all__ = ["RedisPresence"]


class RedisPresence(RedisInbox):
    """Pending index, runtime registry and notices on Redis (a base of ``RedisSignalStore``)."""

    async def _index(self, threads: Sequence[str]) -> None:
        now = time.time() * 1000
        async with self._pipeline("pending index update") as pipe:
            for thread in threads:
                pipe.zadd(self.keys.pending_shard(thread), {thread: now}, lt=True)
            await pipe.execute()

    async def due(self, *, limit: int = 100, until: float | None = None) -> Due:
        """Threads due by ``until`` (after indexing the threads of runtimes whose presence
        lapsed), the longest-due first, and the next due time after ``until``."""
        for runtime_id in await self._orphan_dead_runtimes():
            self._log.info("signals.runtime_dead", dead_runtime_id=runtime_id)
        now = time.time() * 1000
        horizon = now if until is None else min(until * 1000, 1e300)
        per_shard = max(1, -(-limit // self.keys.shards))
        async with self._pipeline("pending index read") as pipe:
            for n in range(self.keys.shards):
                pipe.zrangebyscore(self.keys.shard(n), "-inf", horizon, start=0, num=per_shard,
                                   withscores=True)
            for n in range(self.keys.shards):
                pipe.zrangebyscore(self.keys.shard(n), f"({max(horizon, now)}", "+inf",
                                   start=0, num=1, withscores=True)
            replies = await pipe.execute()
        shards = self.keys.shards
        rows = sorted((score, text(member)) for reply in replies[:shards]
                      for member, score in reply)
        later = [score for reply in replies[shards:] for _, score in reply]
        return Due([thread for _, thread in rows][:limit],
                   min(later) / 1000 if later else None)

    async def register_runtime(self, info: RuntimeInfo, ttl_ms: int) -> None:
        key = self.keys.runtime(info.runtime_id)
        async with self._pipeline("runtime registration") as pipe:
            pipe.hset(key, mapping={"host": info.host, "pid": info.pid,
                                    "started_at": info.started_at, "worker": int(info.worker)})
            pipe.pexpire(key, ttl_ms)
            pipe.zadd(self.keys.registry, {info.runtime_id: info.started_at})
            await pipe.execute()

    async def refresh_runtime(self, runtime_id: str, ttl_ms: int) -> bool:
        async with self._errors("runtime presence"):
            return bool(await self.client.pexpire(self.keys.runtime(runtime_id), ttl_ms))

    async def unregister_runtime(self, runtime_id: str) -> None:
        await self._orphan(runtime_id)

    async def _orphan(self, runtime_id: str) -> None:
        """Index the threads of ``runtime_id`` (their owner is gone), then forget it. A crash
        in between repeats the step; it never loses a thread."""
        threads_key = self.keys.runtime_threads(runtime_id)
        async with self._errors("runtime cleanup"):
            cursor = 0
            while True:
                cursor, batch = await self.client.sscan(threads_key, cursor, count=1000)
                if batch:
                    await self._index([text(t) for t in batch])
                if cursor == 0:
                    break
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.delete(threads_key, self.keys.runtime(runtime_id))
                pipe.zrem(self.keys.registry, runtime_id)
                await pipe.execute()

    async def track_threads(
        self, runtime_id: str, *, add: Sequence[str] = (), remove: Sequence[str] = ()
    ) -> None:
        key = self.keys.runtime_threads(runtime_id)
        async with self._errors("runtime thread tracking"):
            if add:
                await self.client.sadd(key, *add)
            if remove:
                await self.client.srem(key, *remove)

    async def runtime_threads(self, runtime_id: str) -> list[str]:
        """The threads ``runtime_id`` owns (as far as the registry knows)."""
        async with self._errors("runtime threads read"):
            members = await self.client.smembers(self.keys.runtime_threads(runtime_id))
        return sorted(text(t) for t in members)

    async def _registered(self) -> list[tuple[str, Any]]:
        ids = [text(r) for r in await self.client.zrange(self.keys.registry, 0, -1)]
        async with self.client.pipeline(transaction=False) as pipe:
            for rid in ids:
                pipe.hgetall(self.keys.runtime(rid))
            rows = await pipe.execute()
        return list(zip(ids, rows, strict=True))

    async def _orphan_dead_runtimes(self) -> list[str]:
        async with self._errors("runtime registry read"):
            dead = [rid for rid, row in await self._registered() if not row]
        for rid in dead:
            await self._orphan(rid)
        return dead

    async def runtimes(self) -> list[RuntimeInfo]:
        async with self._errors("runtime registry read"):
            registered = await self._registered()
        out = []
        for rid, raw in registered:
            if raw:
                row = {text(k): text(v) for k, v in raw.items()}
                out.append(RuntimeInfo(rid, row.get("host", ""), int(row.get("pid", 0)),
                                       float(row.get("started_at", 0)),
                                       bool(int(row.get("worker", 0)))))
        return out

    # -- notices ---------------------------------------------------------------------------

    async def notify(self, runtime_id: str | None, notice: Notice) -> None:
        keys = self.keys
        channel = keys.work_channel if runtime_id is None else keys.notice_prefix + runtime_id
        message = "\n".join(
            [notice.kind, notice.thread_key, notice.run_id or "", notice.reason or ""]
        )
        async with self._errors("notice"):
            if is_cluster(self.client):  # (redis-py before 8.0 has no RedisCluster.publish)
                cluster: Any = self.client
                await cluster.execute_command("PUBLISH", channel, message,
                                              target_nodes=cluster.get_random_node())
            else:
                await self.client.publish(channel, message)

    @asynccontextmanager
    async def listen(
        self, runtime_id: str, handler: Callable[[Notice], None], *, worker: bool
    ) -> AsyncIterator[None]:
        """Listen for notices on one connection (reconnecting with backoff) until exit."""
        channels = [self.keys.notice_prefix + runtime_id]
        if worker:
            channels.append(self.keys.work_channel)
        ready = anyio.Event()
        async with owned_task_group() as tg:
            tg.start_soon(self._listen_loop, channels, handler, ready, name="signals notices")
            with anyio.fail_after(30):
                await ready.wait()
            yield

    async def _listen_loop(
        self, channels: list[str], handler: Callable[[Notice], None], ready: anyio.Event
    ) -> None:
        backoff = 0.05
        while True:
            pubsub: Any = None
            node_client: Any = None
            try:
                if is_cluster(self.client):
                    # PUBLISH reaches every node of a Cluster: listen on one, over a plain
                    # client to it (no cluster pub/sub needed from redis-py).
                    await self._ready()
                    cluster: Any = self.client
                    node = cluster.get_node_from_key(channels[0])
                    node_client = node_reader_client(node, block_ms=30_000,
                                                     name=f"{self.keys.prefix}:notices")
                    pubsub = node_client.pubsub(ignore_subscribe_messages=True)
                else:
                    pubsub = self.client.pubsub(ignore_subscribe_messages=True)
                await pubsub.subscribe(*channels)
                handler(Notice("resync"))
                ready.set()
                backoff = 0.05
                while True:
                    data = await _next_message(pubsub)
                    if data is not None:
                        handler(_notice(data))
                        # The run the notice woke goes first: the next read's set-up is not
                        # on its path.
                        await checkpoint()
            except Exception as exc:
                self._log.warning("signals.notices_reconnect", error=repr(exc), retry_in_s=backoff)
            finally:
                with anyio.CancelScope(shield=True), anyio.move_on_after(1):
                    if pubsub is not None:
                        await pubsub.aclose()
                    if node_client is not None:
                        await node_client.aclose()
            await anyio.sleep(backoff)
            with suppress(BackendError):
                await refresh_slots(self.client)  # a Cluster node may have failed over
            backoff = min(backoff * 2, 2.0)


_MESSAGE = (b"message", "message")


async def _next_message(pubsub: Any, timeout: float = 30.0) -> Any:
    """The data of the next message on the channels ``pubsub`` subscribed to; ``None`` after
    ``timeout`` seconds without one, or for a reply that is not a message (handed to
    redis-py's own bookkeeping: subscriptions, its health check's ``PONG``).

    What ``pubsub.get_message`` does, with two differences, both for the listen loop to
    reconnect and send its handler ``resync``:

    * no retry: redis-py's would reconnect and resubscribe in silence after a connection
      error, and the notices published meanwhile would be missed unseen;
    * a health check (``PING``) with nothing read for ``timeout`` after it is a lost
      connection (``redis.exceptions.ConnectionError``), as a network black hole leaves it:
      a live server answers at once.

    About 6 µs per message here instead of 12 (warm)."""
    conn = pubsub.connection
    start = loop_time()
    pinged = bool(conn.health_check_interval) and start > conn.next_health_check
    await pubsub.check_health()  # (the PING, when one is due)
    response = await conn.read_response(
        timeout=timeout, disconnect_on_error=False, push_request=True)
    if isinstance(response, list) and len(response) == 3 and response[0] in _MESSAGE:
        return response[2]
    if response is not None:
        await pubsub.handle_message(response, ignore_subscribe_messages=True)
    elif pinged and loop_time() - start >= timeout / 2:  # (not a RESP3 push read at once)
        raise redis.exceptions.ConnectionError(
            f"no reply to a health check in {timeout:g} s on the notice connection")
    return None


def _notice(data: Any) -> Notice:
    kind, thread_key, run_id, reason, carried = (text(data).split("\n", 4) + [""] * 5)[:5]
    if kind not in ("signal", "work", "due", "pause", "abort", "resync"):
        kind = "resync"  # unknown: treat as "look at everything"
    entry = None
    if carried:
        entry_id, _, raw = carried.partition(" ")
        try:
            entry = decode_entry(entry_id, raw, "deliver", 1, state="carried",
                                 holder=run_id or None)
        except (KeyError, TypeError, ValueError):
            entry = None  # the run takes it instead
    return Notice(kind, thread_key, run_id or None, reason or None, entry)  # type: ignore[arg-type]
