"""A consumer process for the SIGKILL tests.

Run as ``python -m tests.pubsub_kill_worker URL PREFIX [MODE]``.

Mode ``group`` (the default) joins group ``g`` on topic ``t``; records each handled event id with
RPUSH on ``<prefix>:handled``; on the event whose data is ``"block"`` it records
``<prefix>:started`` and hangs until killed.

Mode ``fanout`` subscribes to topic ``t`` without a group (so it owns a private fan-out group)
with ``reclaim_idle_ms=50`` (a liveness TTL of half a second), prints ``ready <consumer id>`` and
waits to be killed.
"""

from __future__ import annotations

import sys

import anyio
import redis.asyncio

from pubsub import Event, RedisStreamsPubSub


async def main(url: str, prefix: str, mode: str = "group") -> None:
    record = redis.asyncio.Redis.from_url(url)

    async def handler(event: Event) -> None:
        if event.data == "block":
            await record.rpush(f"{prefix}:started", event.id)
            await anyio.sleep_forever()
        await record.rpush(f"{prefix}:handled", event.id)

    if mode == "fanout":
        async with RedisStreamsPubSub(
            url=url, key_prefix=prefix, block_ms=100, reclaim_idle_ms=50
        ) as pubsub:
            await pubsub.subscribe("t", handler)
            print("ready", pubsub.process_id, flush=True)
            await anyio.sleep(60)
        return
    async with RedisStreamsPubSub(url=url, key_prefix=prefix, block_ms=100) as pubsub:
        await pubsub.subscribe("t", handler, group="g", start_from="earliest")
        print("ready", flush=True)
        await anyio.sleep(60)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "group")
