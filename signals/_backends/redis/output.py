"""Output streams on Redis: ``emit``, ``stream_read`` and one follower per process.

Each thread's output is a stream ``S:{t}:stream`` (fields ``k`` kind, ``r`` run id, ``s``
signal id, ``d`` data JSON, ``t`` time), trimmed exactly to ``stream_max_parts`` and
``stream_retention_ms``; ``S:{t}:meta`` remembers the newest trimmed id, so a cursor below it
is refused (:class:`~signals.CursorExpiredError`) instead of silently skipping parts.

:class:`~signals._backends.redis.follower.RedisFollower` serves every stream reader of a
process over one pub/sub connection (one per node on a Cluster), O(1) per part.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio

from _signal_leases.aio import owned_task_group
from _signal_leases.errors import CursorExpiredError
from _signal_leases.redis.script import Script, run_script
from _signal_leases.redis.support import stream_id, text
from signals._backends.redis.follower import RedisFollower
from signals._backends.redis.inbox import RedisInbox
from signals._backends.redis.lua import EMIT, READ_STREAM
from signals._backends.redis.parts import decode_part
from signals._model import StreamPart

if TYPE_CHECKING:
    from signals.kit._capabilities import PartIn

__all__ = ["RedisOutput"]


class RedisOutput(RedisInbox):
    """``emit``, ``stream_read`` and ``follower`` (a base of ``RedisSignalStore``)."""

    def _scripts(self) -> tuple[Any, Any]:
        scripts = getattr(self, "_output_scripts", None)
        if scripts is None:
            scripts = (Script(self.client, EMIT), Script(self.client, READ_STREAM))
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
        # (writes=False: no WAIT under wait_replicas, as docs/cluster.md says: a stream of
        # tokens would pay a round trip per part; lifecycle parts go with the inbox's writes)
        ids = await run_script(self._handle, self._scripts()[0], keys, args, "stream append",
                               writes=False)
        return [text(i) for i in ids]

    async def stream_read(
        self, thread_key: str, *, after: str | None = None, limit: int = 100
    ) -> list[StreamPart]:
        """The parts after ``after`` (``None``: from the oldest retained), at most ``limit``."""
        keys = [self.keys.thread(thread_key, "stream"), self.keys.thread(thread_key, "meta")]
        tmax, rows = await run_script(self._handle, self._scripts()[1], keys,
                                      [after or "", limit], "stream read", writes=False)
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
    async def follower(self) -> AsyncIterator[RedisFollower]:
        """One watcher for every stream reader of this process (one pub/sub connection; on a
        Cluster one per node, see ``follower``)."""
        follower = RedisFollower(self.client, self.keys, self._log)
        async with owned_task_group() as tg:
            await tg.start(follower.run)
            try:
                yield follower
            finally:
                tg.cancel_scope.cancel()
                with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                    await follower.close()
