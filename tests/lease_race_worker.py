"""One contender of the multi-process lease race (run as a script by test_leases_race.py).

Usage: ``python tests/lease_race_worker.py URL PREFIX KEY OWNER``. Connects, counts itself
ready (``INCR <prefix>:ready``), blocks on ``BLPOP <prefix>:go`` (1 s at a time) until the
parent releases every contender with one ``RPUSH``, races ``acquire_lease`` and prints one
JSON line.
"""

from __future__ import annotations

import json
import sys

import anyio
import redis.asyncio

from leases import RedisLeaseProvider


async def contend(url: str, prefix: str, key: str, owner: str) -> dict[str, object]:
    client = redis.asyncio.Redis.from_url(url)
    try:
        provider = RedisLeaseProvider(client=client, key_prefix=prefix)
        await client.ping()
        await client.incr(f"{prefix}:ready")
        # Short blocking reads, well under the client's socket timeout, until released.
        for _ in range(120):
            if await client.blpop([f"{prefix}:go"], timeout=1) is not None:
                break
        else:
            return {"owner": owner, "error": "never released"}
        result = await provider.acquire_lease(key, owner, 30_000)
        return {
            "owner": owner,
            "acquired": result.acquired,
            "reported_owner": result.owner,
            "token": result.token,
        }
    finally:
        await client.aclose()


def main(argv: list[str]) -> int:
    url, prefix, key, owner = argv
    print(json.dumps(anyio.run(contend, url, prefix, key, owner)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
