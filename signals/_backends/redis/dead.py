"""Dead letters of :class:`~signals.RedisSignalStore`: list, retry, purge (a base of the
store, on top of :class:`~signals._backends.redis.presence.RedisPresence` for the pending index)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from _signal_leases.redis_support import atomic_pipeline, text
from signals._backends.redis.presence import RedisPresence
from signals._model import Signal
from signals._store import DeadLetter

__all__ = ["RedisDeadLetters"]


class RedisDeadLetters(RedisPresence):
    """The per-thread dead-letter hash: ``{signal id: {s, m, n, e, at}}``."""

    _idx: str

    async def dead_letters(self, thread_key: str, *, limit: int = 100) -> list[DeadLetter]:
        async with self._errors("dead-letter read"):
            raw: Any = await self.client.hgetall(self.keys.thread(thread_key, "dead"))
        out = []
        for value in raw.values():
            obj = json.loads(value)
            signal = Signal.from_dict(json.loads(obj["s"]), mode=obj.get("m", "deliver"))
            out.append(DeadLetter(signal, int(obj["n"]), obj.get("e") or None, float(obj["at"])))
        return sorted(out, key=lambda d: d.at)[:limit]

    async def retry_dead(self, thread_key: str, signal_ids: Sequence[str]) -> list[str]:
        retried = []
        dead_key = self.keys.thread(thread_key, "dead")
        for sid in signal_ids:
            async with self._errors("dead-letter retry"):
                raw = await self.client.hget(dead_key, sid)
                if raw is None:
                    continue
                obj = json.loads(raw)
                if self._idx == "0":  # Cluster: index first (the shard is another slot)
                    await self._index([thread_key])
                async with atomic_pipeline(self.client) as pipe:
                    pipe.xadd(self.keys.thread(thread_key, "inbox"),
                              {"s": obj["s"], "m": obj.get("m", "deliver"), "i": sid})
                    pipe.hset(self.keys.thread(thread_key, "receipts"), sid,
                              json.dumps({"status": "pending", "at": time.time()}))
                    pipe.hdel(dead_key, sid)
                    if self._idx == "1":
                        shard = self.keys.pending_shard(thread_key)
                        pipe.zadd(shard, {thread_key: time.time() * 1000}, nx=True)
                    new_id, *_ = await pipe.execute()
                await self.client.hset(self.keys.thread(thread_key, "attempts"), f"x:{sid}",
                                       text(new_id))
            retried.append(sid)
        return retried

    async def purge_dead(self, thread_key: str, signal_ids: Sequence[str] | None = None) -> int:
        dead_key = self.keys.thread(thread_key, "dead")
        async with self._errors("dead-letter purge"):
            if signal_ids is None:
                count = int(await self.client.hlen(dead_key))
                await self.client.delete(dead_key)
                return count
            if not signal_ids:
                return 0
            return int(await self.client.hdel(dead_key, *signal_ids))
