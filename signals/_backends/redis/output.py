"""Output streams on Redis: ``emit``, ``stream_read`` and one follower per process.

Each thread's output is a stream ``S:{t}:stream`` (fields ``k`` kind, ``r`` run id, ``s``
signal id, ``d`` data JSON, ``t`` time), trimmed exactly to ``stream_max_parts`` and
``stream_retention_ms``; ``S:{t}:meta`` remembers the newest trimmed id, so a cursor below it
is refused (:class:`~signals.CursorExpiredError`) instead of silently skipping parts.

:class:`RedisFollower` serves every stream reader of a process with ONE blocking connection:
a single ``XREAD BLOCK`` over all the streams anybody waits on, each at the lowest cursor its
waiters asked for. A waiter on a stream the pending ``XREAD`` does not cover (or at a lower
cursor) interrupts it with ``CLIENT UNBLOCK`` and waits until the reader rebuilt its set.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from typing import TYPE_CHECKING, Any

import anyio
import redis.exceptions

from _signal_leases.aio import owned_task_group
from _signal_leases.errors import CursorExpiredError
from _signal_leases.redis_support import UNAVAILABLE, is_cluster, reader_client, stream_id, text
from signals._backends.redis.cluster_follower import ClusterFollower
from signals._backends.redis.lua import EMIT, READ_STREAM
from signals._backends.redis.parts import Waiters, decode_part
from signals._model import StreamPart

if TYPE_CHECKING:
    import redis.asyncio

    from _signal_leases.keys import SignalKeys
    from _signal_leases.logs import Logger
    from signals.kit._capabilities import PartIn

__all__ = ["RedisFollower", "RedisOutput"]

_BLOCK_MS = 5000
_FAILURES: tuple[type[Exception], ...] = (*UNAVAILABLE, redis.exceptions.ResponseError)
_COUNT = 100




class RedisOutput:
    """``emit``, ``stream_read`` and ``follower`` (a base of ``RedisSignalStore``)."""

    client: redis.asyncio.Redis
    keys: SignalKeys
    _stream_cfg: str
    _log: Logger

    def _errors(self, what: str) -> AbstractAsyncContextManager[None]:
        raise NotImplementedError

    def _scripts(self) -> tuple[Any, Any]:
        scripts = getattr(self, "_output_scripts", None)
        if scripts is None:
            scripts = (self.client.register_script(EMIT), self.client.register_script(READ_STREAM))
            self._output_scripts = scripts
        return scripts

    async def emit(self, thread_key: str, parts: Sequence[PartIn]) -> list[str]:
        """Append ``parts`` to the thread's output stream; their cursors, in order."""
        if not parts:
            return []
        args: list[Any] = [self._stream_cfg]
        for p in parts:
            args += [p.kind, p.run_id, p.signal_id or "", p.data or ""]
        keys = [self.keys.thread(thread_key, "stream"), self.keys.thread(thread_key, "meta")]
        async with self._errors("stream append"):
            ids = await self._scripts()[0](keys=keys, args=args)
        return [text(i) for i in ids]

    async def stream_read(
        self, thread_key: str, *, after: str | None = None, limit: int = 100
    ) -> list[StreamPart]:
        """The parts after ``after`` (``None``: from the oldest retained), at most ``limit``."""
        keys = [self.keys.thread(thread_key, "stream"), self.keys.thread(thread_key, "meta")]
        async with self._errors("stream read"):
            tmax, rows = await self._scripts()[1](keys=keys, args=[after or "", limit])
        if after is not None and tmax and stream_id(after) < stream_id(tmax):
            raise CursorExpiredError(
                f"cursor {after!r} of thread {thread_key!r} is older than the stream retains "
                f"(parts up to {text(tmax)} were trimmed); read again from after=None"
            )
        return [decode_part(thread_key, raw_id, flat) for raw_id, flat in rows]

    async def stream_tail(self, thread_key: str) -> str | None:
        """The cursor of the newest part of the thread's stream (``None``: empty)."""
        async with self._errors("stream read"):
            rows: Any = await self.client.xrevrange(
                self.keys.thread(thread_key, "stream"), "+", "-", count=1
            )
        return text(rows[0][0]) if rows else None

    @asynccontextmanager
    async def follower(self) -> AsyncIterator[RedisFollower | ClusterFollower]:
        """One watcher for every stream reader of this process (one blocking connection; on
        a Cluster one sharded pub/sub connection per node, see ``cluster_follower``)."""
        follower: RedisFollower | ClusterFollower
        if is_cluster(self.client):
            follower = ClusterFollower(self.client, self.keys, self._log)
        else:
            follower = RedisFollower(self.client, self.keys, self._log)
        async with owned_task_group() as tg:
            await tg.start(follower.run)
            try:
                yield follower
            finally:
                tg.cancel_scope.cancel()
                with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                    await follower.close()




class RedisFollower:
    """See the module docstring."""

    def __init__(self, client: Any, keys: SignalKeys, log: Logger) -> None:
        self._client = client
        self._keys = keys
        self._log = log
        self._reader = reader_client(client, block_ms=_BLOCK_MS, name=f"{keys.prefix}:follower")
        self._waiters = Waiters()
        self._reading: dict[str, tuple[int, int]] = {}  # thread -> cursor of the pending XREAD
        self._generation = 0  # bumped when the set to read changes
        self._read_generation = -1  # the generation the pending XREAD was built from
        self._reader_id: int | None = None
        self._changed = anyio.Event()

    async def close(self) -> None:
        await self._reader.aclose()

    async def wait(self, thread_key: str, after: str | None) -> list[StreamPart]:
        waiter = self._waiters.add(thread_key, after)
        try:
            current = self._reading.get(thread_key)
            if current is None or stream_id(waiter.after) < current:
                await self._refresh()
            await waiter.event.wait()
            return waiter.parts
        finally:
            self._waiters.remove(waiter)

    async def _refresh(self) -> None:
        """Make the reader rebuild its set, interrupting a blocked XREAD, and wait until it
        did (a rebuild that raced the interrupt is retried)."""
        self._generation += 1
        wanted = self._generation
        self._changed.set()
        delay = 0.001
        while self._read_generation < wanted:
            if self._reader_id is not None:
                try:
                    await self._client.client_unblock(self._reader_id)
                except _FAILURES as exc:
                    self._log.debug("signals.follower_unblock_failed", error=repr(exc))
            with anyio.move_on_after(delay):
                while self._read_generation < wanted:  # noqa: ASYNC110 (set by the reader)
                    await anyio.sleep(0.0005)
            delay = min(delay * 2, 0.1)

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        self._reader_id = int(await self._reader.client_id())
        task_status.started()
        backoff = 0.05
        while True:
            generation = self._generation
            # A woken waiter's reader comes back from its last part: read on from there,
            # not again from before it (an XREAD that returned what was handed out already).
            self._reading = {
                thread: min(stream_id(w.resume_at) for w in waiters)
                for thread, waiters in self._waiters.items() if waiters
            }
            self._read_generation = generation
            if not self._reading:
                self._changed = anyio.Event()
                if self._generation == generation:
                    with anyio.move_on_after(_BLOCK_MS / 1000):
                        await self._changed.wait()
                continue
            read_from = dict(self._reading)  # what this XREAD reads after, per thread
            streams: Any = {
                self._keys.thread(t, "stream"): f"{ms}-{seq}"
                for t, (ms, seq) in read_from.items()
            }
            threads = {self._keys.thread(t, "stream"): t for t in self._reading}
            try:
                reply: Any = await self._reader.xread(streams, count=_COUNT, block=_BLOCK_MS)
                backoff = 0.05
            except _FAILURES as exc:
                if "UNBLOCKED" not in str(exc):
                    self._log.warning(
                        "signals.follower_error", error=repr(exc), retry_in_s=backoff
                    )
                    self._reader_id = None
                    await anyio.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)
                    with suppress(*_FAILURES):
                        self._reader_id = int(await self._reader.client_id())
                continue
            for raw_stream, entries in reply or []:
                thread = threads.get(text(raw_stream))
                if thread is None:
                    continue
                parts = [decode_part(thread, raw_id, flat) for raw_id, flat in entries]
                for waiter in list(self._waiters.get(thread, [])):
                    if stream_id(waiter.after) < read_from[thread] or waiter.event.is_set():
                        continue  # it waits from before what this read covers: next read
                    mine = [p for p in parts if stream_id(p.cursor) > stream_id(waiter.after)]
                    if mine:
                        waiter.parts = mine
                        waiter.event.set()
