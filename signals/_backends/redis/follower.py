"""The stream follower of :class:`~signals.RedisSignalStore`: one per process, for all of its
``stream()`` readers, on one Redis or a Cluster.

Every script that appends a part also announces it on a pub/sub channel named like the stream
(see ``add_part`` in ``lua``): ``PUBLISH`` on one Redis, ``SPUBLISH`` on a Cluster (the same
hash tag as the stream, so the same slot and node). This follower keeps ONE pub/sub connection
per node it needs (one on a single Redis; not one per thread) and subscribes there to the
channels of the streams somebody in this process waits on. A part costs it O(1), whatever the
number of streams followed.

* A waiter subscribes first and waits for the node's confirmation, then reads once: a part
  appended after the read is announced to the subscription, so nothing falls in between.
* An announcement carries the part (up to ``ANNOUNCE_BYTES``). The follower remembers the last
  part announced per stream while its subscription holds (announcements arrive in the order
  the parts were appended): a waiter whose cursor is that part gets the next one straight from
  the announcement, and a waiter that comes back from it needs no read. Any other waiter (an
  older cursor, a part announced by its id only, the first part after subscribing) is served
  by one ``XRANGE`` of that stream.
* A channel whose waiters are gone stays subscribed for ``_LINGER_S`` (a reader that asks
  again for the next part does not pay two more round trips) and is then dropped.
* A broken connection (Redis restarted, a Cluster node died or failed over) or a channel the
  node gave up (its slot moved) re-homes the affected streams: on a Cluster the slot map is
  fetched again; the streams are subscribed again (commands sent back to back: one per node,
  one per slot on a Cluster, at most ``_BATCH`` channels each) and their waiters read what they
  may have missed (one pipeline per ``_BATCH`` streams), not a round trip or two per stream.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from _signal_leases.errors import BackendError, BackendUnavailableError
from _signal_leases.redis.support import (
    UNAVAILABLE,
    is_cluster,
    map_errors,
    node_reader_client,
    reader_client,
    refresh_slots,
    stream_id,
    text,
)
from signals._backends.redis.parts import Waiters, decode_announcement, decode_part

if TYPE_CHECKING:
    from _signal_leases.keys import SignalKeys
    from _signal_leases.logs import Logger
    from signals._model import StreamPart

__all__ = ["RedisFollower"]

_LINGER_S = 5.0
_TICK_S = 1.0
_CONFIRM_S = 5.0
_COUNT = 100
_BATCH = 500  # streams per (un)subscribe command and per pipeline of catch-up reads
_FAILURES: tuple[type[BaseException], ...] = (*UNAVAILABLE, BackendError)


async def _channel_command(pubsub: Any, command: str, *channels: str) -> None:
    """``(UN)SUBSCRIBE`` or ``S(UN)SUBSCRIBE`` ``channels`` (on a Cluster, of one slot). redis-py
    before 8.0 has no ``PubSub.ssubscribe``; sent raw, its replies and messages still come back
    from ``get_message`` as dicts typed ``ssubscribe``, ``smessage`` and ``sunsubscribe``."""
    method = getattr(pubsub, command.lower(), None)
    if method is not None:
        await method(*channels)
    else:
        await pubsub.execute_command(command, *channels)


@dataclass(eq=False)
class _Node:
    name: str
    client: Any
    pubsub: Any
    channels: set[str] = field(default_factory=set)
    wake: anyio.Event = field(default_factory=anyio.Event)
    # (Un)subscriptions one at a time: two at once on a fresh PubSub would each take a
    # connection from the pool and one of them would be orphaned.
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    swept: float = 0.0  # when idle channels were last looked for (once per tick, not per part)
    # channel -> our UNSUBSCRIBEs whose reply has not come yet (any other is the node's own)
    leaving: Counter[str] = field(default_factory=Counter)


class RedisFollower:
    """See the module docstring: ``run``, ``wait``, ``close``."""

    def __init__(self, client: Any, keys: SignalKeys, log: Logger) -> None:
        self._client = client
        self._keys = keys
        self._log = log
        self._cluster = is_cluster(client)
        self._shard = "S" if self._cluster else ""  # sharded pub/sub on a Cluster
        self._waiters = Waiters()
        self._idle_since: dict[str, float] = {}  # thread -> when its last waiter left
        self._nodes: dict[str, _Node] = {}
        self._thread_of: dict[str, str] = {}  # channel -> thread
        self._node_of: dict[str, str] = {}  # thread -> node name (once subscribed)
        self._confirming: dict[str, anyio.Event] = {}  # channel -> set when subscribed
        # thread -> the cursor of its newest part, known since its subscription was confirmed
        # (from an announcement, or a read that found nothing newer); gone when it breaks
        self._head: dict[str, str] = {}
        # thread -> a stamp, new at each confirmed subscription and each announcement, gone
        # when the subscription breaks: unchanged around a read, nothing came in between
        self._stamp: dict[str, int] = {}
        self._stamps = itertools.count()
        self._tg: anyio.abc.TaskGroup | None = None

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            task_status.started()
            await anyio.sleep_forever()

    async def close(self) -> None:
        for node in list(self._nodes.values()):
            await self._drop(node)

    async def wait(self, thread_key: str, after: str | None) -> list[StreamPart]:
        waiter = self._waiters.add(thread_key, after)
        self._idle_since.pop(thread_key, None)
        try:
            backoff = 0.05
            while True:
                try:
                    await self._subscribe(thread_key)
                    break
                except _FAILURES as exc:
                    self._log.warning("signals.follower_rehome_failed", key=thread_key,
                                      error=repr(exc), retry_in_s=backoff)
                    await anyio.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)
                    with suppress(*_FAILURES):
                        await refresh_slots(self._client)
            if self._head.get(thread_key) != waiter.after:  # else: the next part is announced
                stamp = self._stamp.get(thread_key)
                parts = await self._read(thread_key, waiter.after)
                if parts:
                    return parts
                if stamp is not None and self._stamp.get(thread_key) == stamp and \
                        thread_key not in self._head:
                    # Nothing after ``after`` when read, on the same subscription and with no
                    # announcement since: the next part announced is the one after it.
                    self._head[thread_key] = waiter.after
            await waiter.event.wait()
            return waiter.parts
        finally:
            if self._waiters.remove(waiter):
                self._idle_since[thread_key] = time.monotonic()

    async def _read(self, thread_key: str, after: str) -> list[StreamPart]:
        with map_errors("stream read"):
            rows: Any = await self._client.xrange(
                self._keys.thread(thread_key, "stream"), f"({after}", "+", count=_COUNT
            )
        return [decode_part(thread_key, raw_id, flat) for raw_id, flat in rows]

    async def _read_many(self, reads: list[tuple[str, str]]) -> list[list[StreamPart]]:
        """:meth:`_read` of each ``(thread, after)``: one pipeline per ``_BATCH`` streams."""
        if len(reads) == 1:
            return [await self._read(*reads[0])]
        out: list[list[StreamPart]] = []
        for start in range(0, len(reads), _BATCH):
            chunk = reads[start:start + _BATCH]
            pipe = self._client.pipeline(transaction=False)
            for thread_key, after in chunk:
                pipe.xrange(self._keys.thread(thread_key, "stream"), f"({after}", "+",
                            count=_COUNT)
            with map_errors("stream read"):
                replies: Any = await pipe.execute()
            out += [[decode_part(thread_key, raw_id, flat) for raw_id, flat in rows]
                    for (thread_key, _), rows in zip(chunk, replies, strict=True)]
        return out

    async def _catch_up(self, *thread_keys: str) -> None:
        """For each of ``thread_keys``, read the parts after the lowest cursor any of its
        waiters holds and hand each waiter the ones past its own cursor (many threads: one
        pipelined round trip per ``_BATCH``)."""
        todo = [(t, list(self._waiters[t])) for t in thread_keys if self._waiters.get(t)]
        reads = [(t, min((w.resume_at for w in waiters), key=stream_id))  # woken: from its
                 for t, waiters in todo]                                    # last part
        for (_, waiters), parts in zip(todo, await self._read_many(reads), strict=True):
            for waiter in waiters:
                mine = [p for p in parts if stream_id(p.cursor) > stream_id(waiter.after)]
                if mine and not waiter.event.is_set():
                    waiter.parts = mine
                    waiter.event.set()

    async def _on_announcement(self, thread_key: str, note: Any) -> None:
        """Hand an announced part to the waiters right behind it; the others read."""
        cursor, part = decode_announcement(thread_key, note)
        self._stamp[thread_key] = next(self._stamps)
        previous = self._head.get(thread_key)
        if part is None:
            self._head.pop(thread_key, None)  # not known: the next waiter reads
        elif previous is None or stream_id(cursor) > stream_id(previous):
            self._head[thread_key] = cursor
        read = False
        for waiter in self._waiters.get(thread_key, []):
            if waiter.event.is_set() or stream_id(cursor) <= stream_id(waiter.after):
                continue
            if part is not None and waiter.after == previous:
                waiter.parts = [part]
                waiter.event.set()
            else:
                read = True  # parts it has not had may come before this one
        if read:
            await self._catch_up(thread_key)

    async def _node_for(self, channel: str) -> _Node:
        """The node serving ``channel``, with its pub/sub connection (made on first use)."""
        assert self._tg is not None, "the follower is not running"
        if self._cluster:
            await self._client.initialize()  # a no-op once the slot map is known
            target = self._client.get_node_from_key(channel)
            name = target.name
        else:
            target, name = None, "redis"
        node = self._nodes.get(name)
        if node is None:
            block_ms, client_name = int(_TICK_S * 1000), f"{self._keys.prefix}:follower"
            client = (node_reader_client(target, block_ms=block_ms, name=client_name)
                      if self._cluster else
                      reader_client(self._client, block_ms=block_ms, name=client_name))
            node = _Node(name, client, client.pubsub())
            self._nodes[name] = node
            self._tg.start_soon(self._listen, node, name=f"follower {name}")
        return node

    def _commands(self, channels: Iterable[str]) -> list[list[str]]:
        """``channels`` (of one node) split into (un)subscribe commands: at most ``_BATCH`` in
        one, and on a Cluster one slot per command (sharded pub/sub refuses more)."""
        slots: dict[int, list[str]] = {}
        for channel in channels:
            slots.setdefault(self._client.keyslot(channel) if self._cluster else 0,
                             []).append(channel)
        return [group[start:start + _BATCH]
                for group in slots.values() for start in range(0, len(group), _BATCH)]

    async def _by_node(self, channels: list[str]) -> list[tuple[_Node, list[str]]]:
        """``channels`` grouped into subscribe commands for the nodes serving them."""
        nodes: dict[str, tuple[_Node, list[str]]] = {}
        for channel in channels:
            node = await self._node_for(channel)
            nodes.setdefault(node.name, (node, []))[1].append(channel)
        return [(node, command) for node, group in nodes.values()
                for command in self._commands(group)]

    async def _subscribe(self, *thread_keys: str) -> None:
        """Subscribe to the channels of ``thread_keys``' streams on the nodes serving them, and
        return once the nodes confirmed (a read before that could miss an announcement). The
        commands go out back to back: many threads cost one round trip, not one each."""
        waiting: list[tuple[str, str, anyio.Event]] = []
        fresh: dict[str, str] = {}  # channel -> thread, for the channels this call subscribes
        for thread_key in thread_keys:
            if thread_key in self._node_of:
                continue
            channel = self._keys.thread(thread_key, "stream")
            confirmed = self._confirming.get(channel)
            if confirmed is None:
                confirmed = self._confirming[channel] = anyio.Event()
                fresh[channel] = thread_key
            waiting.append((thread_key, channel, confirmed))
        if not waiting:
            return  # (a reader's every wait asks: followed already)
        unsent, node = set(fresh), None
        try:
            with map_errors("stream follow"):
                for node, channels in await self._by_node(list(fresh)):
                    self._thread_of.update((channel, fresh[channel]) for channel in channels)
                    node.channels.update(channels)
                    async with node.lock:
                        with anyio.CancelScope(shield=True):  # a cut write: a new connection
                            await _channel_command(node.pubsub, f"{self._shard}SUBSCRIBE",
                                                   *channels)
                    unsent.difference_update(channels)
                    node.wake.set()  # the listener reads the confirmations
        except BaseException as exc:
            for channel in unsent:  # (a channel sent is confirmed by its node, or lost with it)
                confirmed = self._confirming.pop(channel, None)
                if confirmed is not None:
                    confirmed.set()
            if node is not None and isinstance(exc, Exception):
                await self._lose(node, exc)
            raise
        with anyio.move_on_after(_CONFIRM_S):
            for _, _, confirmed in waiting:
                await confirmed.wait()
        missing = [channel for thread_key, channel, _ in waiting if thread_key not in self._node_of]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise BackendUnavailableError(
                f"Redis did not confirm the subscription to {missing[0]!r}{more}"
            )

    def _forget(self, node: _Node, channels: Iterable[str]) -> list[str]:
        threads = []
        for channel in list(channels):
            node.channels.discard(channel)
            confirmed = self._confirming.pop(channel, None)
            if confirmed is not None:
                confirmed.set()  # its subscriber sees it unconfirmed and tries again
            thread = self._thread_of.pop(channel, None)
            if thread is not None and self._node_of.get(thread) == node.name:
                del self._node_of[thread]
                self._head.pop(thread, None)
                self._stamp.pop(thread, None)
                threads.append(thread)
            if thread is not None and thread not in self._waiters:
                self._idle_since.pop(thread, None)
        return threads

    async def _drop(self, node: _Node) -> None:
        if self._nodes.get(node.name) is node:
            del self._nodes[node.name]
        with anyio.CancelScope(shield=True), anyio.move_on_after(1), suppress(Exception):
            await node.pubsub.aclose()
            await node.client.aclose()

    async def _listen(self, node: _Node) -> None:
        try:
            while self._nodes.get(node.name) is node:  # until it is dropped
                if not node.channels or node.pubsub.connection is None:  # nothing to read yet
                    if node.wake.is_set():
                        node.wake = anyio.Event()  # (checked again before waiting on it)
                    else:
                        with anyio.move_on_after(_LINGER_S):
                            await node.wake.wait()
                    continue
                message = await node.pubsub.get_message(timeout=_TICK_S)
                if message is not None:
                    await self._on_message(node, message)
                if time.monotonic() - node.swept >= _TICK_S:
                    node.swept = time.monotonic()
                    await self._sweep(node)
        except Exception as exc:
            await self._lose(node, exc)

    async def _lose(self, node: _Node, exc: Exception) -> None:
        """A node's connection failed: redis-py may have connected it again and subscribed
        its channels again, but what was announced in between is lost. Drop it, subscribe
        its streams anew, and let their waiters read what they missed."""
        if self._nodes.get(node.name) is not node:
            return  # lost already
        self._log.warning("signals.follower_node_lost", node=node.name, error=repr(exc))
        threads = self._forget(node, node.channels)
        await self._drop(node)  # its listener, if running, fails and ends
        assert self._tg is not None
        self._tg.start_soon(self._rehome, threads)

    async def _on_message(self, node: _Node, message: dict[str, Any]) -> None:
        kind, channel = text(message.get("type")), text(message.get("channel"))
        if self._cluster:
            kind = kind.removeprefix("s")
        thread = self._thread_of.get(channel)
        if kind == "subscribe" and thread is not None and channel in node.channels:
            if self._node_of.get(thread) == node.name:
                # Subscribed again without our asking: redis-py connected anew and restored
                # the subscriptions; what was announced in between is lost.
                await self._lose(node, BackendUnavailableError("pub/sub connection renewed"))
                return
            self._node_of[thread] = node.name
            self._stamp[thread] = next(self._stamps)
            confirmed = self._confirming.pop(channel, None)
            if confirmed is not None:
                confirmed.set()
        elif kind == "message" and thread is not None and self._node_of.get(thread) == node.name:
            try:
                await self._on_announcement(thread, message.get("data"))
            except _FAILURES as exc:
                # Its waiters may need the read that failed: follow the stream anew (a
                # subscription and a read, retried with backoff).
                self._log.warning("signals.follower_read_failed", key=thread, error=repr(exc))
                assert self._tg is not None
                self._tg.start_soon(self._rehome, self._forget(node, [channel]))
        elif kind == "unsubscribe":
            if node.leaving[channel] > 0:  # the reply to our own UNSUBSCRIBE
                node.leaving[channel] -= 1
                if not node.leaving[channel]:
                    del node.leaving[channel]
            elif channel in node.channels:
                # The node gave the channel up (its slot moved): follow it to its new node.
                assert self._tg is not None
                self._tg.start_soon(self._rehome, self._forget(node, [channel]))

    async def _sweep(self, node: _Node) -> None:
        """Unsubscribe from channels nobody has waited on for ``_LINGER_S``."""
        horizon = time.monotonic() - _LINGER_S

        def idle(channel: str) -> bool:
            thread = self._thread_of.get(channel, "")
            return channel in node.channels and thread not in self._waiters and \
                self._idle_since.get(thread, 0.0) < horizon

        for command in self._commands(filter(idle, list(node.channels))):
            async with node.lock:
                # Checked again: a reader may have come back while an earlier command was sent.
                leaving = [c for c in command if idle(c)]
                if not leaving:
                    continue
                for channel in leaving:
                    self._idle_since.pop(self._thread_of.get(channel, ""), None)
                    node.leaving[channel] += 1  # (a waiter may subscribe again before the reply)
                self._forget(node, leaving)
                await _channel_command(node.pubsub, f"{self._shard}UNSUBSCRIBE", *leaving)

    async def _rehome(self, threads: list[str]) -> None:
        """Subscribe ``threads`` (those somebody still waits on) where they are served now,
        then let their waiters read what they may have missed; retried with backoff until
        both succeeded for each."""
        backoff = 0.05
        pending = list(threads)
        while True:
            pending = [t for t in pending if t in self._waiters]
            if not pending:
                return
            try:
                await refresh_slots(self._client)
                await self._subscribe(*pending)  # (nothing to do for those subscribed)
                await self._catch_up(*pending)
                return
            except _FAILURES as exc:
                self._log.warning("signals.follower_rehome_failed", error=repr(exc),
                                  retry_in_s=backoff)
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
