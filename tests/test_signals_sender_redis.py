"""``RedisSignalSender``: a process that runs no thread sends as a sender-only runtime does,
on one Redis and on a Cluster, and imports neither anyio nor the runtime to do it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import anyio
import pytest
from structlog.testing import capture_logs

from pubsub import RedisStreamsPubSub
from signals import (
    ClosedError,
    Delivery,
    Receipt,
    RedisSignalSender,
    Run,
    Signal,
    SignalRuntime,
    SignalTooLargeError,
    UnsupportedBackendError,
)
from tests._interrupt import RunRecorder, interrupt_a_waiting_run

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

ROOT = Path(__file__).resolve().parent.parent


def _shape(delivery: Delivery) -> tuple[Any, ...]:
    """What a send's result says, without the ids that differ from thread to thread."""
    return (delivery.outcome, delivery.duplicate, delivery.owner is not None,
            delivery.receipt.status if delivery.receipt else None, delivery.reason,
            len(delivery.superseded), len(delivery.dropped), delivery.backpressure)


async def test_a_sender_sends_as_a_sender_only_runtime_does(
    target: tuple[str, bool], key_prefix: str
) -> None:
    """The same sends, one thread through a sender-only ``SignalRuntime``, another through a
    ``RedisSignalSender``: the same results, the same logs, and the worker's runs get the
    same signals."""
    url, cluster = target
    started: dict[str, list[Run]] = defaultdict(list)
    got: dict[str, list[Any]] = defaultdict(list)
    changed = anyio.Event()

    async def agent(run: Run) -> None:
        nonlocal changed
        started[run.thread_key].append(run)
        changed.set()
        async for signal in run:
            got[run.thread_key].append((signal.payload, run.interrupted))
            await run.ack(signal)
            changed.set()

    async def until(check: Any) -> None:
        nonlocal changed
        with anyio.fail_after(20):
            while not check():
                changed = anyio.Event()
                await changed.wait()

    async def script(send: Any, thread: str) -> list[tuple[Any, ...]]:
        results = [await send(thread, Signal("first", id=f"{thread}-1"))]
        await until(lambda: got[thread])  # the worker's run holds the thread from here on
        results.append(await send(thread, Signal("second", id=f"{thread}-2")))
        results.append(await send(thread, Signal("again", id=f"{thread}-2")))  # duplicate
        results.append(await send(thread, "refused", if_active="reject"))
        results.append(await send(thread, "dropped", if_active="discard"))
        results.append(await send(thread, Signal("lane", lane="l", cache_key="k")))
        results.append(await send(thread, Signal("same", lane="l", cache_key="k")))
        results.append(await send(thread, "later", delay_ms=600_000))
        results.append(await send(thread, "next run", if_active="queue"))
        await until(lambda: any(p == "next run" for p, _ in got[thread]))
        results.append(await send(thread, "stop", if_active="interrupt"))
        with pytest.raises(SignalTooLargeError):
            await send(thread, "x" * 2048 * 1024)
        return [_shape(d) for d in results]

    async with RedisStreamsPubSub(url=url, key_prefix=key_prefix, cluster=cluster) as pubsub, \
            SignalRuntime(pubsub=pubsub, agent=agent, idle_wait_ms=600_000,
                          lease_ttl_ms=10_000) as _worker, \
            SignalRuntime(pubsub=pubsub, agent=None) as sender_runtime, \
            RedisSignalSender(url=url, key_prefix=key_prefix, cluster=cluster) as sender:
        with capture_logs() as runtime_logs:
            by_runtime = await script(sender_runtime.send, "by-runtime")
        with capture_logs() as sender_logs:
            by_sender = await script(sender.send, "by-sender")

    assert by_sender == by_runtime
    assert [r[0] for r in by_sender] == [
        "queued", "deliver", "discarded", "rejected", "discarded", "deliver", "unchanged",
        "scheduled", "queued", "deliver"]

    def events(logs: list[Any]) -> list[tuple[str, Any]]:
        return [(e["event"], e.get("outcome")) for e in logs
                if e["event"].startswith("signal.") and e.get("key", "").startswith("by-")]

    assert events(sender_logs) == events(runtime_logs)
    assert all(e["key"] == "by-sender" and e["signal_id"] for e in sender_logs
               if e["event"] in ("signal.accepted", "signal.refused", "signal.duplicate"))
    for thread in ("by-runtime", "by-sender"):
        payloads = [p for p, _ in got[thread]]
        assert payloads[:3] == ["first", "second", "lane"]
        assert "next run" in payloads and "dropped" not in payloads and "again" not in payloads
        assert len(started[thread]) >= 2  # "next run" started a run of its own


async def test_a_sender_caps_a_thread_s_pending_signals(redis_url: str, key_prefix: str) -> None:
    async with RedisSignalSender(url=redis_url, key_prefix=key_prefix,
                                 max_pending_per_thread=1) as sender:
        assert (await sender.send("t", "one")).outcome == "queued"
        second = await sender.send("t", "two")
    assert second.outcome == "rejected" and second.reason


async def test_a_sender_reads_receipts(redis_url: str, key_prefix: str) -> None:
    async with RedisSignalSender(url=redis_url, key_prefix=key_prefix) as sender:
        await sender.send("t", Signal("x", id="s1"))
        await sender.send("t", Signal("y", id="s2"), delay_ms=60_000)
        assert [(await sender.receipt("t", sid)) for sid in ("s1", "s2", "s3")] == [
            Receipt("s1", "pending", at=ANY), Receipt("s2", "scheduled", at=ANY), None]
        with pytest.raises(ValueError, match="signal id"):
            await sender.receipt("t", "")
    with pytest.raises(ClosedError):
        await sender.receipt("t", "s1")


async def test_a_sender_s_bad_input_names_the_argument(redis_url: str, key_prefix: str) -> None:
    with pytest.raises(ValueError, match="key_prefix"):
        RedisSignalSender(url=redis_url, key_prefix="")
    with pytest.raises(ValueError, match="max_pending_per_thread"):
        RedisSignalSender(url=redis_url, max_pending_per_thread=0)
    with pytest.raises(ValueError, match="overflow"):
        RedisSignalSender(url=redis_url, overflow="newest")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_signal_bytes"):
        RedisSignalSender(url=redis_url, max_signal_bytes=10)
    with pytest.raises((ValueError, TypeError), match="url"):
        RedisSignalSender()
    sender = RedisSignalSender(url=redis_url, key_prefix=key_prefix)
    with pytest.raises(ValueError, match="thread key"):
        await sender.send("", "x")
    with pytest.raises(ValueError, match="if_active"):
        await sender.send("t", "x", if_active="now")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="if_idle"):
        await sender.send("t", "x", if_idle="start")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="delay_ms"):
        await sender.send("t", "x", delay_ms=-1)
    await sender.aclose()
    with pytest.raises(ClosedError):
        await sender.send("t", "x")


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_sender_under_trio_says_it_needs_asyncio(redis_url: str) -> None:
    sender = RedisSignalSender(url=redis_url)
    with pytest.raises(UnsupportedBackendError, match="asyncio"):
        await sender.send("t", "x")
    with pytest.raises(UnsupportedBackendError, match="asyncio"):
        async with sender:
            pass


def test_a_sender_process_imports_neither_anyio_nor_the_runtime(redis_url: str) -> None:
    """The serverless cold start (docs/performance.md): ``from signals import
    RedisSignalSender`` and one send load redis-py, the records and the Redis core's script
    calls; not anyio, the lease or pub/sub layers, structlog or the runtime."""
    code = (
        "import asyncio, sys\n"
        "from signals import RedisSignalSender\n"
        "async def main():\n"
        "    async with RedisSignalSender(url=sys.argv[1], key_prefix='cold') as sender:\n"
        "        print((await sender.send('t', {'n': 1})).outcome)\n"
        "asyncio.run(main())\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('anyio', 'leases', 'pubsub', 'structlog', 'trio', 'sniffio') or m.startswith(("
        "'signals._run', 'signals._chain', 'signals.kit._store', "
        "'signals._backends.redis.store', 'signals._backends.redis.follower'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, redis_url], capture_output=True,
                         text=True, check=True, cwd=ROOT, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout.split()
    assert out == ["queued", "[]"]


@pytest.mark.parametrize("by", ["runtime", "sender"])
async def test_an_interrupt_never_reaches_the_run_it_stops(
    target: tuple[str, bool], key_prefix: str, by: str
) -> None:
    """A run waiting for more signals is interrupted from another process (a sender-only
    runtime, or a ``RedisSignalSender``): it is cancelled without the interrupting signal,
    which a new run gets with ``Run.interrupted`` set."""
    url, cluster = target
    recorder = RunRecorder()
    async with RedisStreamsPubSub(url=url, key_prefix=key_prefix, cluster=cluster) as pubsub, \
            SignalRuntime(pubsub=pubsub, agent=recorder, idle_wait_ms=600_000,
                          shutdown_timeout_ms=0), \
            SignalRuntime(pubsub=pubsub, agent=None) as sender_runtime, \
            RedisSignalSender(url=url, key_prefix=key_prefix, cluster=cluster) as sender:
        await interrupt_a_waiting_run(
            recorder, sender_runtime.send if by == "runtime" else sender.send, timeout=10)


async def test_a_send_no_worker_hears_is_a_warning(redis_url: str, key_prefix: str) -> None:
    """On one Redis, a signal queued where no worker runtime listens (a wrong key prefix, or
    no worker yet) logs ``signal.unheard``; with a worker listening, nothing."""

    async def agent(run: Run) -> None:
        async for signal in run:
            await run.ack(signal)

    with capture_logs() as logs:
        async with RedisSignalSender(url=redis_url, key_prefix=key_prefix) as sender:
            assert (await sender.send("t", "nobody yet")).outcome == "queued"
            async with RedisStreamsPubSub(url=redis_url, key_prefix=f"{key_prefix}-other"
                                          ) as pubsub, \
                    SignalRuntime(pubsub=pubsub, agent=agent):
                assert (await sender.send("u", "wrong prefix")).outcome == "queued"
            async with RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix) as pubsub, \
                    SignalRuntime(pubsub=pubsub, agent=agent):
                assert (await sender.send("v", "heard")).outcome == "queued"
    unheard = [e for e in logs if e["event"] == "signal.unheard"]
    assert [(e["key"], e["log_level"]) for e in unheard] == [("t", "warning"), ("u", "warning")]
    assert "key prefix" in unheard[0]["reason"]
