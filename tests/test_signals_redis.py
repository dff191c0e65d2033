"""The signal runtime on a real Redis: several processes, crashes, handoffs, lease loss."""

from __future__ import annotations

import json
import os
import signal as os_signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis.asyncio
from structlog.testing import capture_logs

from leases import RedisLeaseProvider
from pubsub import RedisStreamsPubSub
from signals import BackendUnavailableError, RedisSignalStore, Run, Signal, SignalRuntime

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

ROOT = Path(__file__).resolve().parent.parent



def _worker(redis_url: str, prefix: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.signals_worker", *args, "--redis-url", redis_url,
         "--prefix", prefix],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _lines(proc: subprocess.Popen[str], timeout: float = 60) -> list[dict[str, Any]]:
    out, _ = proc.communicate(timeout=timeout)
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def _texts(rows: list[bytes | str]) -> list[str]:
    return [r.decode() if isinstance(r, bytes) else r for r in rows]


async def _poll_until(read: Callable[[], Awaitable[bool]], timeout: float = 30) -> None:
    """Poll another process's progress (no event to wait on across processes)."""
    with anyio.fail_after(timeout):
        while True:
            if await read():
                return
            await anyio.sleep(0.05)


async def _processed(redis_url: str, prefix: str) -> list[str]:
    client = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
    try:
        return _texts(await client.lrange(f"{prefix}:processed", 0, -1))
    finally:
        await client.aclose()


@pytest.mark.slow
async def test_concurrent_senders_one_wake_every_signal_once(
    redis_url: str, key_prefix: str
) -> None:
    start_at = time.time() + 3.0
    procs = [
        _worker(
            redis_url, key_prefix, "send",
            "--ids", ",".join(f"p{n}-s{i}" for i in range(3)),
            "--start-at", str(start_at),
            "--work-ms", "150",
            "--idle-wait-ms", "1500",
            "--exit-after-send",
        )
        for n in range(4)
    ]
    outputs = [_lines(p) for p in procs]
    sent = [line for out in outputs for line in out if line["event"] == "sent"]
    assert len(sent) == 12
    outcomes = Counter(line["outcome"] for line in sent)
    assert outcomes["wake"] == 1, outcomes
    assert outcomes["deliver"] == 11, outcomes
    processed = await _processed(redis_url, key_prefix)
    ids = [row.split()[0] for row in processed]
    assert sorted(ids) == sorted(line["id"] for line in sent)  # each exactly once
    winner = next(line["pid"] for line in sent if line["outcome"] == "wake")
    assert {row.split()[2] for row in processed} == {str(winner)}


@pytest.mark.slow
async def test_killed_owner_signals_are_processed_by_the_next_owner(
    redis_url: str, key_prefix: str
) -> None:
    ttl = "1000"
    owner = _worker(
        redis_url, key_prefix, "send",
        "--ids", "a,b,c", "--block-on", "a", "--ttl-ms", ttl, "--seconds", "60",
    )
    client = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
    try:
        async def owner_started() -> bool:
            return bool(await client.lrange(f"{key_prefix}:started", 0, -1))

        await _poll_until(owner_started)
        os.kill(owner.pid, os_signal.SIGKILL)
        owner.communicate(timeout=10)
        # A second process that sends nothing: its recovery loop must find the orphaned inbox.
        survivor = _worker(
            redis_url, key_prefix, "serve", "--ttl-ms", ttl, "--recover-ms", "300",
            "--seconds", "60", "--work-ms", "10",
        )
        try:
            async def all_processed() -> bool:
                return len(await client.lrange(f"{key_prefix}:processed", 0, -1)) >= 3

            await _poll_until(all_processed)
            started = await client.lrange(f"{key_prefix}:started", 0, -1)
        finally:
            survivor.kill()
            survivor.communicate(timeout=10)
        processed = await client.lrange(f"{key_prefix}:processed", 0, -1)
    finally:
        await client.aclose()
    assert started == ["a", "a"]  # "a" was in flight when the owner died: delivered again
    assert sorted(row.split()[0] for row in processed) == ["a", "b", "c"]
    assert {row.split()[2] for row in processed} == {str(survivor.pid)}


async def test_probe_never_sees_the_lease_free_during_handoffs(
    redis_url: str, key_prefix: str
) -> None:
    ran: list[str] = []

    async def agent(run: Run) -> None:
        async for _signal in run:
            ran.append(run.run_id)
            await anyio.sleep(0.05)

    observed: list[str | None] = []
    done = anyio.Event()
    async with RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix, block_ms=100) as pubsub:
        probe = RedisLeaseProvider(url=redis_url, key_prefix=f"{key_prefix}:lease")

        async def poll() -> None:
            while not done.is_set():
                observed.append(await probe.get_lease_owner("t"))
                await anyio.sleep(0.002)

        async with anyio.create_task_group() as tg:
            tg.start_soon(poll)
            async with SignalRuntime(pubsub=pubsub, agent=agent) as runtime:
                first = await runtime.send("t", Signal("first"))
                assert first.outcome == "wake"
                for i in range(4):
                    queued = await runtime.send("t", Signal(i), if_active="queue")
                    assert queued.outcome == "queued"
                await runtime.wait_idle()
            done.set()
        await probe.aclose()
    owners = list(observed)
    while owners and owners[0] is None:
        owners.pop(0)
    while owners and owners[-1] is None:
        owners.pop()
    assert None not in owners, "the lease was free between two runs of the chain"
    assert len(set(ran)) == 5  # five runs, one per queued signal, handed over by transfer
    assert len(set(owners)) >= 2


async def test_lost_session_on_redis_cancels_the_run(redis_url: str, key_prefix: str) -> None:
    cancelled = anyio.Event()
    started = anyio.Event()

    async def agent(run: Run) -> None:
        async for _signal in run:
            started.set()
            try:
                await anyio.sleep_forever()
            finally:
                cancelled.set()

    async with RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix, block_ms=100) as pubsub:
        with capture_logs() as logs:
            async with SignalRuntime(pubsub=pubsub, agent=agent, lease_ttl_ms=600) as runtime:
                await runtime.send("t", Signal("x"))
                with anyio.fail_after(5):
                    await started.wait()
                # The session expires (as if this process had stalled past the TTL).
                [session] = await pubsub.redis_client.keys(f"{key_prefix}:lease:session:*")
                await pubsub.redis_client.delete(session)
                with anyio.fail_after(5):
                    await cancelled.wait()
                    await runtime.wait_idle()
        store = RedisSignalStore(client=pubsub.redis_client, key_prefix=f"{key_prefix}:signals")
        # The in-flight signal was not processed: it stays for the next owner.
        assert (await store.describe(["t"]))["t"].pending == 1
    events = [entry["event"] for entry in logs]
    assert "lease.lost" in events
    assert "run.cancelled" in events


async def test_runtime_takes_leases_and_inbox_from_the_redis_pubsub(
    redis_url: str, key_prefix: str
) -> None:
    async def agent(run: Run) -> None:
        async for _ in run:
            pass

    async with RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix) as pubsub:
        runtime = SignalRuntime(pubsub=pubsub, agent=agent)
        assert runtime.leases is pubsub.get_lease_provider()
        assert isinstance(runtime.store, RedisSignalStore)
        assert runtime.store.key_prefix == f"{key_prefix}:signals"
        assert runtime.store.fuses_with(runtime.leases)


async def test_unreachable_redis_is_a_clear_error() -> None:
    from leases import BackendUnavailableError

    async def agent(run: Run) -> None:
        return None

    pubsub = RedisStreamsPubSub(url="redis://127.0.0.1:1/0")
    with pytest.raises(BackendUnavailableError):
        async with pubsub, SignalRuntime(pubsub=pubsub, agent=agent) as runtime:
            await runtime.send("t", Signal("x"))


async def test_wait_replicas_without_replicas_refuses_to_report_a_signal_accepted(
    redis_url: str, key_prefix: str
) -> None:
    """A standalone Redis has no replica: with ``wait_replicas=1`` an accept is applied but
    never confirmed, so the sender gets BackendUnavailableError (and may resend the same id)."""
    store = RedisSignalStore(url=redis_url, key_prefix=key_prefix, wait_replicas=1,
                             wait_timeout_ms=50)
    try:
        with pytest.raises(BackendUnavailableError, match="replica"):
            await store.accept("t", Signal("x", id="s1"), "deliver")
        receipt = await store.receipt("t", "s1")
        assert receipt is not None and receipt.status == "pending"  # applied, not confirmed
        with pytest.raises(ValueError, match="wait_replicas"):
            RedisSignalStore(url=redis_url, wait_replicas=-1)
    finally:
        await store.aclose()


async def test_recovery_backs_off_while_redis_is_down(
    private_redis_server: Any, key_prefix: str
) -> None:
    """A delayed signal comes due while Redis is stopped: the runtime's recovery fails each
    time it looks, and waits longer each time (it spun, a warning per pass, before)."""

    async def agent(run: Run) -> None:
        async for signal in run:
            await run.ack(signal)

    pubsub = RedisStreamsPubSub(url=private_redis_server.url, key_prefix=key_prefix,
                                block_ms=100)
    async with pubsub, SignalRuntime(pubsub=pubsub, agent=agent, lease_ttl_ms=5_000,
                                     shutdown_timeout_ms=0) as runtime:
        await runtime.send("t", Signal("later", not_before=time.time() + 0.3))
        with capture_logs() as logs:
            private_redis_server.stop()
            await anyio.sleep(2.0)
        private_redis_server.start()
    failed = [entry for entry in logs if entry["event"] == "signals.recovery_failed"]
    assert 1 <= len(failed) <= 8, len(failed)
    assert all(entry["retry_in_s"] <= 2.0 for entry in failed)


async def test_a_claim_over_a_dead_sessions_lease_record_takes_a_lease_of_its_own(
    redis_url: str, key_prefix: str
) -> None:
    """The claim script grants where the record of a lease whose session ended lingers: the
    new per-key lease is the claimer's, not read as the dead session's (the claim deletes the
    old record first; it skips that only where there was no record)."""
    from signals.kit import Claim

    async with RedisLeaseProvider(url=redis_url, key_prefix=f"{key_prefix}:lease") as leases:
        store = RedisSignalStore(url=redis_url, key_prefix=key_prefix, leases=leases)
        try:
            session = await leases.open_lease_session(60_000)
            assert session is not None
            assert (await leases.acquire_lease("t", "rt-a/1", 1, session=session)).acquired
            await leases.close_lease_session(session)  # its lease record stays behind
            await store.accept("t", Signal("x"), "deliver")
            claimed = await store.claim("t", Claim("rt-b/1", 60_000, None, "rt-b"))
            assert claimed.claimed
            assert await leases.get_lease_owner("t") == "rt-b/1"
        finally:
            await store.aclose()
