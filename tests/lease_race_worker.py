"""Another process for the lease tests: a contender of the multi-process race (Redis or
SQLite), or a SQLite provider that answers calls (run as a script by the tests).

* ``python tests/lease_race_worker.py URL PREFIX KEY OWNER`` (Redis, test_leases_race.py):
  connects, counts itself ready (``INCR <prefix>:ready``), blocks on ``BLPOP <prefix>:go``
  (1 s at a time) until the parent releases every contender with one ``RPUSH``, races
  ``acquire_lease`` and prints one JSON line.
* ``python tests/lease_race_worker.py --sqlite DB DIR KEY OWNER`` (test_leases_sqlite.py): the
  same race on the SQLite file ``DB``. Ready is the file ``DIR/ready-<OWNER>`` (written after a
  first call, so the schema and a connection are there), go is the file ``DIR/go``.
* ``python tests/lease_race_worker.py --sqlite-serve DB``: reads one JSON call per line
  (``["acquire_lease", "k", "a", 1000]``) from stdin and prints its result as one JSON line,
  until stdin closes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import anyio.to_thread
import redis.asyncio

from leases import AcquireResult, LeaseInfo, RedisLeaseProvider, SQLiteLeaseProvider


def _result(result: AcquireResult, owner: str) -> dict[str, object]:
    return {
        "owner": owner,
        "acquired": result.acquired,
        "reported_owner": result.owner,
        "token": result.token,
    }


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
        return _result(await provider.acquire_lease(key, owner, 30_000), owner)
    finally:
        await client.aclose()


async def contend_sqlite(db: str, folder: str, key: str, owner: str) -> dict[str, object]:
    async with SQLiteLeaseProvider(db) as provider:
        await provider.get_lease_owner(f"{key}-warm-up")
        (Path(folder) / f"ready-{owner}").touch()
        go = Path(folder) / "go"
        for _ in range(120_000):  # 1 ms at a time: every contender starts within about 1 ms
            if go.exists():
                break
            await anyio.sleep(0.001)
        else:
            return {"owner": owner, "error": "never released"}
        return _result(await provider.acquire_lease(key, owner, 30_000), owner)


def _plain(value: object) -> object:
    if isinstance(value, AcquireResult):
        return [value.acquired, value.owner, value.token]
    if isinstance(value, LeaseInfo):
        return [value.owner, value.token, value.ttl_ms_remaining]
    return sorted(value) if isinstance(value, set) else value


async def serve_sqlite(db: str) -> None:
    async with SQLiteLeaseProvider(db) as provider:
        while line := await anyio.to_thread.run_sync(sys.stdin.readline):
            method, *args = json.loads(line)
            kwargs = args.pop() if args and isinstance(args[-1], dict) else {}
            result = await getattr(provider, method)(*args, **kwargs)
            print(json.dumps(_plain(result)), flush=True)


def main(argv: list[str]) -> int:
    if argv[0] == "--sqlite-serve":
        anyio.run(serve_sqlite, argv[1])
        return 0
    where, prefix, key, owner = argv[-4:]  # --sqlite: the database file and barrier folder
    race = contend_sqlite if argv[0] == "--sqlite" else contend
    print(json.dumps(anyio.run(race, where, prefix, key, owner)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
