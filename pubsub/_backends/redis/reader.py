"""The reader of the Redis Streams backend: blocking reads on connections of its own.

A *lane* is one dedicated reader connection and the loop that serves the slots routed to it.
Each pass it issues one ``XREADGROUP`` per *read unit*, with the block time shared between
the units, skips slots whose local backlog is long (no hoarding), hands each entry to its
slot, and acknowledges what needs no handler. The XACK of the entry whose handling drains a
slot the reader skipped goes in one pipeline with the next XREADGROUP of that slot (its
member wakes the reader): with one event at a time, a group consumer's acknowledgement costs
no round trip of its own. A new subscription ends a blocked read at once
(``CLIENT UNBLOCK``). ``NOGROUP`` and ``UNBLOCKED`` replies make the live slots' groups be
recreated (see :mod:`._redis_groups`).

* Standalone Redis: one lane per process serves every slot; a read unit is a group name,
  read over all the streams of that group at once.
* Redis Cluster: a command may touch one hash slot only, so a read unit is a (group name,
  hash slot) pair (in practice one stream), and each node that serves subscribed streams gets
  a lane of its own (one connection per node, not per subscription), started when the node
  gets its first subscribed stream and ended when it has none left. After a failover or a
  resharding (connection errors, ``MOVED``) the slot map is fetched again and the streams
  move to the lanes of their new nodes.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import anyio
import redis.exceptions
from redis.crc import key_slot

from _signal_leases.errors import BackendError, BackendUnavailableError
from _signal_leases.redis.support import (
    is_cluster,
    map_errors,
    node_reader_client,
    reader_client,
    refresh_slots,
    text,
)
from pubsub._backends.redis.slots import READ_COUNT, Slot

if TYPE_CHECKING:
    import redis.asyncio
    from anyio.abc import TaskStatus

    from pubsub._backends.redis.groups import GroupTable

__all__ = ["StreamReader"]

_MULTI_GROUP_CYCLE_MS = 250  # pickup latency bound with several read units on one lane
_UNBLOCK_TRIES = 20  # CLIENT UNBLOCK attempts, 1 ms apart, while a read is still in flight
_CLOSE_TIMEOUT_S = 2.0

_NO_NODE = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException)
Units = dict[tuple[str, int], list[Slot]]  # (group, hash slot or 0) -> the slots read at once


class _Lane:
    """One reader connection (``client``) and its loop; ``node`` is the name of the Cluster
    node it reads from (``None`` on standalone Redis). ``CLIENT UNBLOCK`` goes through the
    main client (to that node, on a Cluster)."""

    def __init__(self, reader: StreamReader, client: redis.asyncio.Redis, node: str | None) -> None:
        self.reader = reader
        self.client = client
        self.node = node
        self.reader_id: int | None = None  # CLIENT ID of the reader connection
        self.blocked = False  # an XREADGROUP is in flight
        self.reads = 0  # XREADGROUPs issued so far
        self.wakeup: anyio.Event | None = None

    async def interrupt(self) -> None:
        """Wake this lane when idle; end its blocking XREADGROUP early with CLIENT UNBLOCK.

        A read about to be sent sees the new version and rebuilds its set first; a read on
        its way to the server is not blocked there yet (UNBLOCK finds nothing to end), so
        UNBLOCK is tried again, briefly, while that same read is in flight."""
        if self.wakeup is not None:
            self.wakeup.set()
        read = self.reads
        for _ in range(_UNBLOCK_TRIES):
            reader_id = self.reader_id
            if not self.blocked or self.reads != read or reader_id is None:
                return
            try:
                with map_errors("CLIENT UNBLOCK"):
                    if await self._unblock(reader_id):
                        return
            except BackendError as exc:
                self.reader.ctx.log.debug("pubsub.unblock_failed", error=repr(exc))
                return
            await anyio.sleep(0.001)

    async def _unblock(self, reader_id: int) -> bool:
        main = self.reader.ctx.client
        if self.node is None:
            return bool(await main.client_unblock(reader_id))
        node = main.get_node(node_name=self.node)
        if node is None:
            return False
        return bool(await main.client_unblock(reader_id, target_nodes=node))

    async def run(self) -> None:
        """Read until stopped (a Cluster lane also stops when its node has nothing left to
        read); connection trouble is logged and retried with backoff."""
        reader = self.reader
        block_ms = reader.ctx.settings.block_ms
        backoff = 0.1
        try:
            while True:
                version = reader.version
                units = reader.units(self.node)
                if not units:
                    if self.node is not None and self.node not in reader.wanted_nodes():
                        return
                    self.wakeup = anyio.Event()
                    with anyio.move_on_after(block_ms / 1000):
                        await self.wakeup.wait()
                    self.wakeup = None
                    continue
                if len(units) == 1:
                    block = block_ms
                else:  # XREADGROUP waits on one unit: cycle through them with short blocks
                    block = max(1, min(block_ms, _MULTI_GROUP_CYCLE_MS) // len(units))
                try:
                    with map_errors("XREADGROUP"):
                        await self._read(units, block, version)
                    backoff = 0.1
                except BackendError as exc:
                    if isinstance(exc, BackendUnavailableError):
                        self.reader_id = None  # a new connection has a new id
                    reader.ctx.log.warning(
                        "pubsub.reader_error", error=repr(exc), retry_in_s=backoff
                    )
                    if self.node is not None:
                        await reader.refresh_slot_map()
                    await anyio.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)
        finally:
            reader.lane_ended(self)
            with anyio.CancelScope(shield=True), anyio.move_on_after(_CLOSE_TIMEOUT_S):
                await self.client.aclose()

    async def _read(self, units: Units, block: int, version: int) -> None:
        reader = self.reader
        if self.reader_id is None:
            self.reader_id = int(await self.client.client_id())
        for (group, _), slots in units.items():
            if reader.version != version:
                return  # a subscription came or went since the read set was built
            streams: Any = {s.stream: ">" for s in slots}
            self.reads += 1
            self.blocked = True
            try:
                reply: Any = await self._xreadgroup(slots, group, streams, block)
            except (redis.exceptions.MovedError, redis.exceptions.AskError) as exc:
                # The slot is served elsewhere now (failover, resharding): nothing was read.
                raise BackendUnavailableError(f"stream moved to another node: {exc}") from exc
            except redis.exceptions.ResponseError as exc:
                # NOGROUP: the stream expired, Redis lost it, or the group was destroyed;
                # UNBLOCKED: the stream was deleted under the blocked read. Recreate the
                # groups of the slots still live (a retired slot's group stays gone).
                if "NOGROUP" not in str(exc) and "UNBLOCKED" not in str(exc):
                    raise
                for slot in slots:
                    await reader.groups.recreate(slot)
                continue
            finally:
                self.blocked = False
            for stream_name, entries in reply or []:
                slot = next(s for s in slots if s.stream == text(stream_name))
                if entries:
                    slot.advance(text(entries[-1][0]))
                to_ack = [
                    text(entry_id)
                    for entry_id, fields in entries
                    if fields and slot.dispatch(text(entry_id), fields, 1)
                ]
                await slot.ack(to_ack)

    async def _xreadgroup(self, slots: list[Slot], group: str, streams: Any, block: int) -> Any:
        """XREADGROUP, behind the XACKs its slots' members left for it in one pipeline."""
        acks = [(slot, slot.take_acks()) for slot in slots if slot.acks]
        if not acks:
            return await self.client.xreadgroup(
                group, slots[0].consumer, streams, count=READ_COUNT, block=block
            )
        pipe = self.client.pipeline(transaction=False)
        for slot, ids in acks:
            pipe.xack(slot.stream, slot.group, *ids)
        pipe.xreadgroup(group, slots[0].consumer, streams, count=READ_COUNT, block=block)
        try:
            results = await pipe.execute(raise_on_error=False)
        except BaseException:
            for slot, ids in acks:  # not sent, or not known to be: send them again
                slot.acks[:0] = ids
            raise
        for (slot, ids), result in zip(acks, results, strict=False):
            if isinstance(result, Exception):  # e.g. MOVED: the main client follows it
                await slot.ack(ids)  # (and logs pubsub.ack_failed if that fails too)
            slot.acks_sent(ids)
        if isinstance(results[-1], Exception):
            raise results[-1]
        return results[-1]


class StreamReader:
    """Reads every live slot of ``groups`` on reader connections of its own (see the module
    docstring): one lane on standalone Redis, one lane per node with subscribed streams on a
    Cluster."""

    def __init__(self, groups: GroupTable) -> None:
        self.groups = groups
        self.ctx = groups.ctx
        self.cluster = is_cluster(self.ctx.client)
        self.version = 0  # bumped by interrupt(): the read set may have changed
        self._scope: anyio.CancelScope | None = None
        self._stopped = False
        self._wakeup: anyio.Event | None = None  # the Cluster supervisor's
        self._lanes: dict[str | None, _Lane] = {}

    @property
    def lanes(self) -> int:
        """Reader connections open now (one per node with subscribed streams on a Cluster)."""
        return len(self._lanes)

    def stop(self) -> None:
        """End :meth:`run` (the loop only: the task group's scope stays untouched)."""
        self._stopped = True
        if self._scope is not None:
            self._scope.cancel()

    async def interrupt(self) -> None:
        """Make the reader rebuild its read set now: wake idle lanes (and the supervisor on a
        Cluster), end blocking reads early (see :meth:`_Lane.interrupt`)."""
        self.version += 1
        if self._wakeup is not None:
            self._wakeup.set()
        for lane in list(self._lanes.values()):
            await lane.interrupt()

    # -- what each lane reads --------------------------------------------------------------

    def _node_of(self, stream: str) -> str | None:
        """The name of the node serving ``stream`` (Cluster), ``None`` when unknown."""
        try:
            node = self.ctx.client.get_node_from_key(stream)
        except _NO_NODE:  # the slot map does not cover it (yet)
            return None
        return None if node is None else str(node.name)

    def _readable(self) -> list[Slot]:
        return [s for s in self.groups.slots.values() if s.members and s.ready.is_set()]

    def wanted_nodes(self) -> dict[str, Any]:
        """Cluster: the nodes serving subscribed streams now, by name."""
        nodes: dict[str, Any] = {}
        for slot in self._readable():
            try:
                node = self.ctx.client.get_node_from_key(slot.stream)
            except _NO_NODE:
                continue
            if node is not None:
                nodes[node.name] = node
        return nodes

    def units(self, node: str | None) -> Units:
        """The read units of the lane of ``node`` (every slot on standalone Redis)."""
        units: Units = {}
        for slot in self._readable():
            if self.cluster and self._node_of(slot.stream) != node:
                continue
            if not slot.wants_read():
                slot.throttled = True  # its member wakes the reader once it drains
                continue
            hash_slot = key_slot(slot.stream.encode()) if self.cluster else 0
            units.setdefault((slot.group, hash_slot), []).append(slot)
        return units

    async def refresh_slot_map(self) -> None:
        """Fetch the Cluster's slot map again (a lane's node failed or moved a stream)."""
        with contextlib.suppress(BackendError):  # the lane's next read reports the trouble
            await refresh_slots(self.ctx.client)
        if self._wakeup is not None:
            self._wakeup.set()

    def lane_ended(self, lane: _Lane) -> None:
        if self._lanes.get(lane.node) is lane:
            del self._lanes[lane.node]
        if self._wakeup is not None:
            self._wakeup.set()  # the supervisor starts another if the node is wanted again

    # -- running ---------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Read until :meth:`stop`."""
        settings, layout = self.ctx.settings, self.ctx.layout
        name = layout.reader_name(self.ctx.process_id)
        with anyio.CancelScope() as self._scope:
            if self._stopped:
                task_status.started()
                return
            if not self.cluster:
                client = reader_client(self.ctx.client, block_ms=settings.block_ms, name=name)
                lane = self._lanes[None] = _Lane(self, client, None)
                task_status.started()
                await lane.run()
                return
            async with anyio.create_task_group() as tg:
                task_status.started()
                while True:
                    for node_name, node in self.wanted_nodes().items():
                        if node_name in self._lanes:
                            continue
                        client = node_reader_client(node, block_ms=settings.block_ms, name=name)
                        lane = self._lanes[node_name] = _Lane(self, client, node_name)
                        tg.start_soon(lane.run, name=f"pubsub redis reader {node_name}")
                    self._wakeup = anyio.Event()
                    with anyio.move_on_after(settings.block_ms / 1000):
                        await self._wakeup.wait()
                    self._wakeup = None
