"""The stream follower of :class:`~signals.RedisSignalStore` on a Redis Cluster.

One ``XREAD BLOCK`` cannot cover streams in different slots, so on a Cluster every script that
appends a part also announces its id with ``SPUBLISH`` on a sharded channel named like the
stream (same hash tag, so the same slot and node; see ``_redis_lua``). This follower keeps ONE
pub/sub connection per master node it needs (not per thread) and subscribes there to the
channels of the streams somebody in this process waits on. An announcement makes it read the
new parts with one ``XRANGE`` and hand them to that stream's waiters.

* A waiter subscribes first and waits for the node's confirmation, then reads once: a part
  appended after the read is announced to the subscription, so nothing falls in between.
* A channel whose waiters are gone stays subscribed for ``_LINGER_S`` (a reader that asks
  again for the next part does not pay two more round trips) and is then dropped.
* A broken connection (a node died, a failover) or a channel the node gave up (its slot moved)
  re-homes the affected streams: the slot map is fetched again, each stream is subscribed on
  the node that now serves it, and its waiters read what they may have missed.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from _signal_leases.errors import BackendError, BackendUnavailableError
from _signal_leases.redis_support import (
    UNAVAILABLE,
    map_errors,
    node_reader_client,
    refresh_slots,
    stream_id,
    text,
)
from signals._backends.redis.parts import Waiters, decode_part

if TYPE_CHECKING:
    from _signal_leases.keys import SignalKeys
    from _signal_leases.logs import Logger
    from signals._model import StreamPart

__all__ = ["ClusterFollower"]

_LINGER_S = 5.0
_TICK_S = 1.0
_CONFIRM_S = 5.0
_COUNT = 100
_FAILURES: tuple[type[BaseException], ...] = (*UNAVAILABLE, BackendError)


async def _shard_command(pubsub: Any, command: str, channel: str) -> None:
    """``SSUBSCRIBE``/``SUNSUBSCRIBE`` one channel. redis-py before 8.0 has no
    ``PubSub.ssubscribe``; sent raw, its replies and messages still come back from
    ``get_message`` as dicts typed ``ssubscribe``, ``smessage`` and ``sunsubscribe``."""
    method = getattr(pubsub, command.lower(), None)
    if method is not None:
        await method(channel)
    else:
        await pubsub.execute_command(command, channel)




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


class ClusterFollower:
    """See the module docstring. Same interface as ``RedisFollower``: ``run``, ``wait``,
    ``close``."""

    def __init__(self, client: Any, keys: SignalKeys, log: Logger) -> None:
        self._client = client
        self._keys = keys
        self._log = log
        self._waiters = Waiters()
        self._idle_since: dict[str, float] = {}  # thread -> when its last waiter left
        self._nodes: dict[str, _Node] = {}
        self._thread_of: dict[str, str] = {}  # channel -> thread
        self._node_of: dict[str, str] = {}  # thread -> node name (once subscribed)
        self._confirming: dict[str, anyio.Event] = {}  # channel -> set when subscribed
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
            parts = await self._read(thread_key, waiter.after)
            if parts:
                return parts
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

    async def _catch_up(self, thread_key: str) -> None:
        """Read the parts after the lowest cursor any waiter of ``thread_key`` holds and hand
        each waiter the ones past its own cursor."""
        waiters = list(self._waiters.get(thread_key, []))
        if not waiters:
            return
        lowest = min((w.resume_at for w in waiters), key=stream_id)  # woken: from its last part
        parts = await self._read(thread_key, lowest)
        for waiter in waiters:
            mine = [p for p in parts if stream_id(p.cursor) > stream_id(waiter.after)]
            if mine and not waiter.event.is_set():
                waiter.parts = mine
                waiter.event.set()

    async def _subscribe(self, thread_key: str) -> None:
        """Subscribe to the channel of ``thread_key``'s stream on the node serving it, and
        return once the node confirmed (a read before that could miss an announcement)."""
        if thread_key in self._node_of:
            return
        assert self._tg is not None, "the follower is not running"
        channel = self._keys.thread(thread_key, "stream")
        confirmed = self._confirming.get(channel)
        if confirmed is None:
            confirmed = self._confirming[channel] = anyio.Event()
            try:
                with map_errors("stream follow"):
                    await self._client.initialize()  # a no-op once the slot map is known
                    target = self._client.get_node_from_key(channel)
                    node = self._nodes.get(target.name)
                    if node is None:
                        client = node_reader_client(
                            target, block_ms=int(_TICK_S * 1000),
                            name=f"{self._keys.prefix}:follower",
                        )
                        node = _Node(target.name, client, client.pubsub())
                        self._nodes[node.name] = node
                        self._tg.start_soon(self._listen, node, name=f"follower {node.name}")
                    self._thread_of[channel] = thread_key
                    node.channels.add(channel)
                    async with node.lock:
                        await _shard_command(node.pubsub, "SSUBSCRIBE", channel)
                    node.wake.set()  # the listener reads the confirmation
            except BaseException:
                self._confirming.pop(channel, None)
                confirmed.set()
                raise
        with anyio.move_on_after(_CONFIRM_S):
            await confirmed.wait()
        if thread_key not in self._node_of:
            raise BackendUnavailableError(
                f"Redis Cluster did not confirm the subscription to {channel!r}"
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
                threads.append(thread)
        return threads

    async def _drop(self, node: _Node) -> None:
        if self._nodes.get(node.name) is node:
            del self._nodes[node.name]
        with anyio.CancelScope(shield=True), anyio.move_on_after(1), suppress(Exception):
            await node.pubsub.aclose()
            await node.client.aclose()

    async def _listen(self, node: _Node) -> None:
        try:
            while True:
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
                await self._sweep(node)
        except Exception as exc:
            self._log.warning("signals.follower_node_lost", node=node.name, error=repr(exc))
            threads = self._forget(node, node.channels)
            await self._drop(node)
            await self._rehome(threads)  # this task ends; the new node has its own listener

    async def _on_message(self, node: _Node, message: dict[str, Any]) -> None:
        kind, channel = text(message.get("type")), text(message.get("channel"))
        thread = self._thread_of.get(channel)
        if kind == "ssubscribe" and thread is not None and channel in node.channels:
            self._node_of[thread] = node.name
            confirmed = self._confirming.pop(channel, None)
            if confirmed is not None:
                confirmed.set()
        elif kind == "smessage" and thread is not None:
            try:
                await self._catch_up(thread)
            except _FAILURES as exc:
                self._log.warning("signals.follower_read_failed", key=thread, error=repr(exc))
        elif kind == "sunsubscribe" and channel in node.channels:
            # The node gave the channel up (its slot moved): follow it to its new node.
            assert self._tg is not None
            self._tg.start_soon(self._rehome, self._forget(node, [channel]))

    async def _sweep(self, node: _Node) -> None:
        """Unsubscribe from channels nobody has waited on for ``_LINGER_S``."""
        horizon = time.monotonic() - _LINGER_S
        idle = [c for c in node.channels
                if self._thread_of.get(c) not in self._waiters
                and self._idle_since.get(self._thread_of.get(c, ""), 0.0) < horizon]
        for channel in idle:
            self._idle_since.pop(self._thread_of.get(channel, ""), None)
            self._forget(node, [channel])
            async with node.lock:
                await _shard_command(node.pubsub, "SUNSUBSCRIBE", channel)

    async def _rehome(self, threads: list[str]) -> None:
        """Subscribe ``threads`` (those somebody still waits on) where they are served now,
        then let their waiters read what they may have missed; retried with backoff."""
        backoff = 0.05
        while True:
            pending = [t for t in threads if t in self._waiters and t not in self._node_of]
            if not pending:
                return
            try:
                await refresh_slots(self._client)
                for thread in pending:
                    await self._subscribe(thread)
                    await self._catch_up(thread)
                return
            except _FAILURES as exc:
                self._log.warning("signals.follower_rehome_failed", error=repr(exc),
                                  retry_in_s=backoff)
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
