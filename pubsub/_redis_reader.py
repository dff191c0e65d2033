"""The reader loop of the Redis Streams backend: one connection per process serves every slot.

It issues one ``XREADGROUP`` per group name, each over all the streams of that group (with
several group names the block time is shared between them), skips slots whose local backlog
is long (no hoarding), hands each entry to its slot, and acknowledges what needs no handler.
A new subscription ends a blocked read at once (``CLIENT UNBLOCK``). ``NOGROUP`` and
``UNBLOCKED`` replies make the live slots' groups be recreated (see :mod:`._redis_groups`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import redis.exceptions

from _signal_leases.errors import BackendError, BackendUnavailableError
from _signal_leases.redis_support import map_errors, text

from ._redis_slots import READ_COUNT, Slot

if TYPE_CHECKING:
    import redis.asyncio
    from anyio.abc import TaskStatus

    from ._redis_groups import GroupTable

__all__ = ["StreamReader"]

_MULTI_GROUP_CYCLE_MS = 250  # pickup latency bound with several group names
_UNBLOCK_TRIES = 20  # CLIENT UNBLOCK attempts, 1 ms apart, while a read is still in flight


class StreamReader:
    """Reads every live slot of ``groups`` on the reader connection given to :meth:`run`."""

    def __init__(self, groups: GroupTable) -> None:
        self._groups = groups
        self._ctx = groups.ctx
        self._scope: anyio.CancelScope | None = None
        self._stopped = False
        self._wakeup: anyio.Event | None = None
        self._reader_id: int | None = None  # CLIENT ID of the reader connection
        self._blocked = False  # an XREADGROUP is in flight
        self._reads = 0  # XREADGROUPs issued so far
        self._version = 0  # bumped by interrupt(): the read set may have changed

    def stop(self) -> None:
        """End :meth:`run` (the loop only: the task group's scope stays untouched)."""
        self._stopped = True
        if self._scope is not None:
            self._scope.cancel()

    async def interrupt(self) -> None:
        """Make the reader rebuild its read set now: wake it when idle, and end a blocking
        XREADGROUP early with CLIENT UNBLOCK (it then returns as if timed out).

        A read about to be sent sees the new version and rebuilds its set first; a read on
        its way to the server is not blocked there yet (UNBLOCK finds nothing to end), so
        UNBLOCK is tried again, briefly, while that same read is in flight."""
        self._version += 1
        if self._wakeup is not None:
            self._wakeup.set()
        read = self._reads
        for _ in range(_UNBLOCK_TRIES):
            reader_id = self._reader_id
            if not self._blocked or self._reads != read or reader_id is None:
                return
            try:
                with map_errors("CLIENT UNBLOCK"):
                    if await self._ctx.client.client_unblock(reader_id):
                        return
            except BackendError as exc:
                self._ctx.log.debug("pubsub.unblock_failed", error=repr(exc))
                return
            await anyio.sleep(0.001)

    def _read_set(self) -> dict[str, list[Slot]]:
        by_group: dict[str, list[Slot]] = {}
        for slot in self._groups.slots.values():
            if not slot.members or not slot.ready.is_set():
                continue
            if not slot.wants_read():
                slot.throttled = True  # its member wakes the reader once it drains
                continue
            by_group.setdefault(slot.group, []).append(slot)
        return by_group

    async def run(
        self,
        reader: redis.asyncio.Redis,
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Read until :meth:`stop`; connection trouble is logged and retried with backoff."""
        block_ms = self._ctx.settings.block_ms
        with anyio.CancelScope() as self._scope:
            task_status.started()
            if self._stopped:
                return
            backoff = 0.1
            while True:
                version = self._version
                by_group = self._read_set()
                if not by_group:
                    self._wakeup = anyio.Event()
                    with anyio.move_on_after(block_ms / 1000):
                        await self._wakeup.wait()
                    self._wakeup = None
                    continue
                if len(by_group) == 1:
                    block = block_ms
                else:  # XREADGROUP waits on one group: cycle through them with short blocks
                    block = max(1, min(block_ms, _MULTI_GROUP_CYCLE_MS) // len(by_group))
                try:
                    with map_errors("XREADGROUP"):
                        await self._read(reader, by_group, block, version)
                    backoff = 0.1
                except BackendError as exc:
                    if isinstance(exc, BackendUnavailableError):
                        self._reader_id = None  # a new connection has a new id
                    self._ctx.log.warning(
                        "pubsub.reader_error", error=repr(exc), retry_in_s=backoff
                    )
                    await anyio.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)

    async def _read(
        self, reader: redis.asyncio.Redis, by_group: dict[str, list[Slot]], block: int, version: int
    ) -> None:
        if self._reader_id is None:
            self._reader_id = int(await reader.client_id())
        for group, slots in by_group.items():
            if self._version != version:
                return  # a subscription came or went since the read set was built
            streams: Any = {s.stream: ">" for s in slots}
            self._reads += 1
            self._blocked = True
            try:
                reply: Any = await reader.xreadgroup(
                    group, slots[0].consumer, streams, count=READ_COUNT, block=block
                )
            except redis.exceptions.ResponseError as exc:
                # NOGROUP: the stream expired, Redis lost it, or the group was destroyed;
                # UNBLOCKED: the stream was deleted under the blocked read. Recreate the
                # groups of the slots still live (a retired slot's group stays gone).
                if "NOGROUP" not in str(exc) and "UNBLOCKED" not in str(exc):
                    raise
                for slot in slots:
                    await self._groups.recreate(slot)
                continue
            finally:
                self._blocked = False
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
