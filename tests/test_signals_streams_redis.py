"""Streams, receipts and control across real processes on Redis: a sender-only process, two
workers, one of them killed mid-stream; and the races that matter for abort and cancel."""

from __future__ import annotations

import functools
import json
import os
import signal as os_signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest

from pubsub import RedisStreamsPubSub
from signals import Run, Signal, SignalRuntime

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

ROOT = Path(__file__).resolve().parent.parent


def _worker(redis_url: str, prefix: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.stream_worker", "--redis-url", redis_url,
         "--prefix", prefix, *args],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _ready(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("the worker exited before it was ready")
        if line.startswith("{"):
            return dict(json.loads(line))


@pytest.mark.slow
async def test_a_killed_worker_s_threads_finish_elsewhere_and_nothing_is_lost(
    target: tuple[str, bool], key_prefix: str
) -> None:
    redis_url, cluster = target
    threads = [f"chat-{n}" for n in range(20)]
    flags = ["--cluster"] if cluster else []
    workers = [_worker(redis_url, key_prefix, "--parts", "10", "--gap-ms", "40", *flags)
               for _ in range(2)]
    try:
        infos = [await anyio.to_thread.run_sync(_ready, w) for w in workers]
        victim, survivor = workers[0], workers[1]
        async with RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix,
                                      cluster=cluster) as pubsub, \
                SignalRuntime(pubsub=pubsub, agent=None) as sender:
            for key in threads:
                delivery = await sender.send(key, Signal({"q": key}, id=f"q-{key}"),
                                             if_idle="enqueue")
                assert delivery.outcome == "queued"
            # Kill the victim once it is mid-stream on some thread.
            with anyio.fail_after(20):
                killed_on: str | None = None
                while killed_on is None:
                    for info in await sender.threads(active=True):
                        if info.runtime_id == infos[0]["runtime_id"]:
                            parts = [p async for p in sender.stream(info.thread_key,
                                                                    follow=False)]
                            if any(p.kind == "part" for p in parts):
                                killed_on = info.thread_key
                                break
                    await anyio.sleep(0.02)
            os.kill(victim.pid, os_signal.SIGKILL)
            victim.wait(timeout=10)
            receipts = {}
            for key in threads:
                receipts[key] = await sender.wait_for(key, f"q-{key}", timeout=60)
            streams = {key: [p async for p in sender.stream(key, follow=False)]
                       for key in threads}
    finally:
        for w in workers:
            w.kill()
            w.wait(timeout=10)
            if w.stdout is not None:
                w.stdout.close()
    assert {r.status for r in receipts.values()} == {"processed"}, receipts
    assert all(r.result["pid"] == survivor.pid or r.result["pid"] == victim.pid
               for r in receipts.values())
    assert receipts[killed_on].result["pid"] == survivor.pid  # taken over and finished
    for key, parts in streams.items():
        cursors = [p.cursor for p in parts]
        assert cursors == sorted(cursors, key=lambda c: tuple(map(int, c.split("-"))))
        assert parts[-1].kind == "run.finished" and ("signal.acked", f"q-{key}") in [
            (p.kind, p.signal_id) for p in parts
        ]
        last_run = parts[-1].run_id
        assert [p.data["i"] for p in parts if p.kind == "part" and p.run_id == last_run] == \
            list(range(10)), "the run that finished emitted every part"
    killed = streams[killed_on]
    dead_runs = {p.run_id for p in killed if p.kind == "part"} - {killed[-1].run_id}
    assert dead_runs, "the killed run's parts stay in the stream, with its run id"
    assert all(run.startswith(infos[0]["runtime_id"]) for run in dead_runs if run)


async def test_an_abort_racing_the_handoff_never_cancels_the_successor(
    redis_url: str, key_prefix: str
) -> None:
    """Run A finishes and hands the lease to B while another runtime aborts A by id: B is
    never cancelled, however the race falls (repeated, with the abort at varying moments)."""
    cancelled: list[str] = []
    runs: list[str] = []

    async def agent(run: Run) -> None:
        runs.append(run.run_id)
        try:
            async for signal in run:
                await anyio.sleep(0.005)
                await run.ack(signal)
        except anyio.get_cancelled_exc_class():
            cancelled.append(run.run_id)
            raise

    async with RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix) as pubsub, \
            SignalRuntime(pubsub=pubsub, agent=agent) as worker, \
            SignalRuntime(pubsub=pubsub, agent=None) as client:
        aborted: set[str] = set()
        for n in range(30):
            key = f"race-{n}"
            first = await worker.send(key, Signal(0, id="a"))
            await worker.send(key, Signal(1, id="b"), if_active="queue")
            await anyio.sleep(0.001 * (n % 10))
            assert first.owner is not None
            aborted.add(first.owner)
            await client.abort(key, first.owner)
            await worker.wait_idle(key)
    assert set(cancelled) <= aborted, "a run other than the one aborted was cancelled"
    assert len(runs) >= 60


async def test_a_cancel_racing_a_pickup_is_cancelled_or_processed_never_both(
    redis_url: str, key_prefix: str
) -> None:
    processed: Counter[str] = Counter()

    async def agent(run: Run) -> None:
        async for signal in run:
            processed[signal.id] += 1
            await run.ack(signal)

    async with RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix) as pubsub, \
            SignalRuntime(pubsub=pubsub, agent=agent) as worker, \
            SignalRuntime(pubsub=pubsub, agent=None) as client:
        ids = [f"s{n}" for n in range(40)]
        for sid in ids:
            async with anyio.create_task_group() as tg:
                tg.start_soon(functools.partial(
                    client.send, "race", Signal(sid, id=sid), if_idle="enqueue"
                ))
                await anyio.sleep(0.0005 * (int(sid[1:]) % 8))
                tg.start_soon(client.cancel, "race", [sid])
        await anyio.sleep(0.3)
        await worker.wait_idle()
        receipts = {sid: await client.receipt("race", sid) for sid in ids}
    for sid, receipt in receipts.items():
        assert receipt is not None
        if receipt.status == "cancelled":
            assert processed[sid] == 0, sid
        else:
            assert receipt.status == "processed" and processed[sid] == 1, (sid, receipt)


async def test_a_follower_waiter_from_an_older_cursor_misses_nothing(
    redis_url: str, key_prefix: str
) -> None:
    """One reader connection follows every waiter: a waiter that arrives from an older cursor
    while a read for a newer one is being answered gets everything after its own cursor, not
    the answer to the newer read. (The race is timing-bound: ten rounds.)"""
    from signals import RedisSignalStore
    from signals.kit import PartIn

    store = RedisSignalStore(url=redis_url, key_prefix=key_prefix)
    part = functools.partial(PartIn, "part", "r/1", None)
    try:
        async with store.follower() as follower:
            for round_ in range(10):
                thread = f"t{round_}"
                cursors = await store.emit(thread, [part(json.dumps(i)) for i in range(6)])
                got: dict[str, list[Any]] = {}

                async def wait(name: str, after: str, thread: str = thread,
                               got: dict[str, list[Any]] = got) -> None:
                    got[name] = [p.data for p in await follower.wait(thread, after)]

                async with anyio.create_task_group() as tg:
                    tg.start_soon(wait, "new", cursors[5])  # the reader blocks after part 5
                    await anyio.sleep(0.05)
                    await store.emit(thread, [part(json.dumps(6))])  # answered now...
                    tg.start_soon(wait, "old", cursors[2])  # ...as an older waiter arrives
                assert got == {"new": [6], "old": [3, 4, 5, 6]}, (round_, got)
    finally:
        await store.aclose()


async def _follow_part_by_part(store: Any, follower: Any, cursor: str,
                               payloads: list[str]) -> list[Any]:
    """For each payload: a reader waits on thread ``t`` from the last cursor it got, then the
    payload is appended; the data the reader got, in order."""
    from signals.kit import PartIn

    got: list[Any] = []
    for payload in payloads:
        async with anyio.create_task_group() as tg:

            async def read(after: str = cursor) -> None:
                nonlocal cursor
                parts = await follower.wait("t", after)
                got.extend(p.data for p in parts)
                cursor = parts[-1].cursor

            tg.start_soon(read)
            await anyio.sleep(0.01)  # the reader waits
            await store.emit("t", [PartIn("part", "r/1", None, payload)])
    return got


async def test_a_followed_part_comes_with_its_announcement(
    redis_url: str, key_prefix: str
) -> None:
    """A reader that takes each part and asks for the next gets it from the part's
    announcement: no read per part (the first parts after subscribing may cost one), and no
    blocking read at all."""
    import redis.asyncio

    from signals import RedisSignalStore
    from signals.kit import PartIn

    store = RedisSignalStore(url=redis_url, key_prefix=key_prefix)
    stats = redis.asyncio.Redis.from_url(redis_url)
    n = 30
    try:
        async with store.follower() as follower:
            cursor = (await store.emit("t", [PartIn("part", "r/1", None, "0")]))[0]

            xranges = 0
            xrange = store.client.xrange

            async def counted(*args: Any, **kwargs: Any) -> Any:
                nonlocal xranges
                xranges += 1
                return await xrange(*args, **kwargs)

            store.client.xrange = counted  # type: ignore[method-assign]

            async def xreads() -> int:  # (the scripts' own XRANGEs are not round trips)
                info: Any = await stats.info("commandstats")
                return int(info.get("cmdstat_xread", {}).get("calls", 0))

            before = await xreads()
            got = await _follow_part_by_part(store, follower, cursor,
                                             [str(i) for i in range(1, n + 1)])
            blocking = await xreads() - before
        assert got == list(range(1, n + 1))
        # The first wait reads once (the stream's end is not known yet); then every part comes
        # with its announcement. Reading per part would take n or more.
        assert xranges <= 3, f"{xranges} reads for {n} parts"
        assert blocking == 0
    finally:
        await stats.aclose()
        await store.aclose()


async def test_a_big_part_is_announced_by_its_id_and_read(
    redis_url: str, key_prefix: str
) -> None:
    """A part over ``ANNOUNCE_BYTES`` is announced by its id only: its waiter reads it, whole,
    and the parts after it still come straight from their announcements."""
    from signals import RedisSignalStore
    from signals._backends.redis.lua import ANNOUNCE_BYTES
    from signals.kit import PartIn

    store = RedisSignalStore(url=redis_url, key_prefix=key_prefix)
    big = json.dumps("x" * (ANNOUNCE_BYTES + 1))
    try:
        async with store.follower() as follower:
            cursor = (await store.emit("t", [PartIn("part", "r/1", None, "0")]))[0]
            got = await _follow_part_by_part(store, follower, cursor, ["1", big, "2", big, "3"])
        assert got == [1, json.loads(big), 2, json.loads(big), 3]
    finally:
        await store.aclose()


async def test_a_follower_that_lost_its_connection_misses_no_part(
    redis_url: str, key_prefix: str
) -> None:
    """The follower's pub/sub connection is killed while a reader waits on a stream whose end
    it knows, and parts are appended at once (their announcements are lost with the
    connection): the follower subscribes again and its reader gets every part, in order."""
    import redis.asyncio

    from signals import RedisSignalStore
    from signals.kit import PartIn

    store = RedisSignalStore(url=redis_url, key_prefix=key_prefix)
    admin = redis.asyncio.Redis.from_url(redis_url)
    try:
        async with store.follower() as follower:
            cursor = (await store.emit("t", [PartIn("part", "r/1", None, "0")]))[0]
            for round_ in range(3):
                got: list[Any] = []

                async def read(after: str = cursor, got: list[Any] = got) -> None:
                    nonlocal cursor
                    while len(got) < 3:
                        parts = await follower.wait("t", after)
                        got.extend(p.data for p in parts)
                        after = cursor = parts[-1].cursor

                with anyio.fail_after(10):
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(read)
                        await anyio.sleep(0.05)  # subscribed, the stream's end known
                        killed = await admin.client_kill_filter(_type="pubsub")
                        assert killed >= 1
                        for i in range(3):
                            await store.emit("t", [PartIn("part", "r/1", None, str(i))])
                assert got == [0, 1, 2], (round_, got)
    finally:
        await admin.aclose()
        await store.aclose()


async def test_a_reader_back_as_its_stream_is_dropped_is_followed_again_at_once(
    redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The follower drops a stream nobody has waited on for its linger (here at once); a
    reader that comes back while that UNSUBSCRIBE is on its way subscribes again, and the
    reply to the UNSUBSCRIBE is not taken for the server giving the channel up (that would
    drop the new subscription: a warning, and the reader waiting for a retry)."""
    import structlog.testing

    import signals._backends.redis.follower as follower_module
    from signals import RedisSignalStore
    from signals.kit import PartIn

    monkeypatch.setattr(follower_module, "_LINGER_S", 0.0)
    monkeypatch.setattr(follower_module, "_TICK_S", 0.002)
    command = follower_module._channel_command
    dropping = anyio.Event()

    async def slow_command(pubsub: Any, name: str, channel: str) -> None:
        await command(pubsub, name, channel)
        if name.endswith("UNSUBSCRIBE"):
            dropping.set()
            await anyio.sleep(0.05)  # its reply comes after the reader below subscribed again

    monkeypatch.setattr(follower_module, "_channel_command", slow_command)
    store = RedisSignalStore(url=redis_url, key_prefix=key_prefix)
    try:
        with structlog.testing.capture_logs() as logs:
            async with store.follower() as follower:
                cursor = (await store.emit("t", [PartIn("part", "r/1", None, "0")]))[0]
                for i in range(1, 6):
                    got: list[Any] = []
                    async with anyio.create_task_group() as tg:

                        async def read(after: str = cursor, got: list[Any] = got) -> None:
                            got.extend(await follower.wait("t", after))

                        tg.start_soon(read)
                        await anyio.sleep(0.01)
                        await store.emit("t", [PartIn("part", "r/1", None, str(i))])
                    assert [p.data for p in got] == [i]
                    cursor = got[-1].cursor
                    with anyio.fail_after(5):
                        await dropping.wait()  # nobody waits: the follower drops "t"
                    dropping = anyio.Event()
        assert [e for e in logs if e["log_level"] == "warning"] == []
    finally:
        await store.aclose()


async def test_a_reader_back_during_a_sweep_keeps_its_stream_followed(
    redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The follower drops idle streams; a reader that comes back for one of them while they
    are being dropped keeps it followed and gets the next part. (The reader is started from
    inside the first drop: the interleaving on purpose.)"""
    import signals._backends.redis.follower as follower_module
    from signals import RedisSignalStore
    from signals.kit import PartIn

    monkeypatch.setattr(follower_module, "_LINGER_S", 0.2)
    monkeypatch.setattr(follower_module, "_TICK_S", 0.05)
    store = RedisSignalStore(url=redis_url, key_prefix=key_prefix)
    part = PartIn("part", "r/1", None, "1")
    try:
        async with store.follower() as follower, anyio.create_task_group() as tg:
            last = {}
            for i in range(20):
                last[f"t{i}"] = (await store.emit(f"t{i}", [part]))[0]
                await follower.wait(f"t{i}", "0-0")  # followed, then idle
            got: list[Any] = []
            forget = follower._forget

            def forget_and_come_back(node: Any, channels: Any) -> list[str]:
                if not got:
                    got.append(None)

                    async def late() -> None:
                        got.extend(await follower.wait("t19", last["t19"]))

                    tg.start_soon(late)
                return forget(node, channels)

            monkeypatch.setattr(follower, "_forget", forget_and_come_back)
            await anyio.sleep(0.6)  # the sweep has run
            cursor = (await store.emit("t19", [part]))[0]
            with anyio.fail_after(5):
                while len(got) < 2:  # noqa: ASYNC110 (filled by the reader)
                    await anyio.sleep(0.02)
            assert [p.cursor for p in got[1:]] == [cursor]
    finally:
        await store.aclose()


async def test_a_connection_lost_during_a_read_leaves_no_gap_for_the_next_reader(
    redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader's read finds nothing; while it is on its way the follower's connection is lost,
    a part is written (announced to nobody) and the stream is followed again. The next reader
    from the same cursor still gets that part: the follower does not take the empty read for
    the stream's end."""
    import redis.asyncio

    from signals import RedisSignalStore
    from signals.kit import PartIn

    store = RedisSignalStore(url=redis_url, key_prefix=key_prefix)
    admin = redis.asyncio.Redis.from_url(redis_url)
    part = PartIn("part", "r/1", None, "1")
    try:
        async with store.follower() as follower, anyio.create_task_group() as tg:
            start = (await store.emit("t", [part]))[0]
            read, rehome = follower._read, follower._rehome
            lost: list[str] = []
            once: list[None] = []
            written = anyio.Event()

            async def rehome_once_written(threads: list[str]) -> None:
                await written.wait()
                await rehome(threads)

            monkeypatch.setattr(follower, "_rehome", rehome_once_written)

            async def read_then_lose(thread: str, after: str) -> Any:
                rows = await read(thread, after)
                if not once:
                    once.append(None)
                    node = follower._nodes["redis"]
                    await admin.client_kill_filter(_type="pubsub")
                    while follower._nodes.get("redis") is node:  # noqa: ASYNC110
                        await anyio.sleep(0.005)  # the loss is noticed
                    lost.append((await store.emit("t", [part]))[0])  # announced to nobody
                    written.set()
                    while "t" not in follower._node_of:  # noqa: ASYNC110
                        await anyio.sleep(0.005)  # followed again
                return rows

            monkeypatch.setattr(follower, "_read", read_then_lose)
            with anyio.fail_after(5):
                first = await follower.wait("t", start)
            assert [p.cursor for p in first] == lost
            second: list[Any] = []

            async def next_reader() -> None:
                second.extend(await follower.wait("t", start))

            tg.start_soon(next_reader)
            await anyio.sleep(0.1)
            later = (await store.emit("t", [part]))[0]
            with anyio.fail_after(5):
                while not second:  # noqa: ASYNC110
                    await anyio.sleep(0.02)
            assert [p.cursor for p in second][:1] == lost, (second, lost, later)
    finally:
        await admin.aclose()
        await store.aclose()


async def test_a_lost_connection_re_homes_many_streams_in_one_go(
    target: tuple[str, bool], key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """60 readers wait on 60 streams; the follower's pub/sub connections are killed and a part
    is appended to each stream before it follows them again. Every reader gets its part, and
    the follower subscribed to the 60 channels again in commands sent back to back (one on a
    single Redis; one per slot on a Cluster) and read what they missed in one pipeline: not a
    subscription and a read in turn for each stream."""
    import redis.asyncio

    import signals._backends.redis.follower as module
    from signals import RedisSignalStore
    from signals.kit import PartIn

    url, cluster = target
    store = RedisSignalStore(url=url, key_prefix=key_prefix, cluster=cluster)
    threads = [f"t{i}" for i in range(60)]
    got: dict[str, list[Any]] = {}
    commands: list[tuple[str, int]] = []
    nodes: list[str] = []
    pipelines: list[None] = []
    reads: list[str] = []
    try:
        async with store.follower() as follower:
            heads = {t: (await store.emit(t, [PartIn("part", "r/1", None, "0")]))[0]
                     for t in threads}
            rehome, written = follower._rehome, anyio.Event()

            async def rehome_once_written(lost: list[str]) -> None:
                await written.wait()
                await rehome(lost)

            monkeypatch.setattr(follower, "_rehome", rehome_once_written)

            async def read(thread: str) -> None:
                got[thread] = [p.data for p in await follower.wait(thread, heads[thread])]

            with anyio.fail_after(20):
                async with anyio.create_task_group() as tg:
                    for thread in threads:
                        tg.start_soon(read, thread)
                    while len(follower._node_of) < len(threads):  # noqa: ASYNC110
                        await anyio.sleep(0.01)  # every stream followed
                    nodes[:] = follower._nodes  # one on a single Redis, each master's
                    for name in nodes:
                        admin = redis.asyncio.Redis.from_url(
                            url if name == "redis" else f"redis://{name}")
                        await admin.client_kill_filter(_type="pubsub")
                        await admin.aclose()
                    while follower._node_of:  # noqa: ASYNC110
                        await anyio.sleep(0.01)  # the loss is noticed
                    for thread in threads:  # announced to nobody
                        await store.emit(thread, [PartIn("part", "r/1", None, "1")])

                    send, pipeline, read_one = (module._channel_command,
                                                follower._client.pipeline, follower._read)

                    async def counted_send(pubsub: Any, command: str, *channels: str) -> None:
                        commands.append((command, len(channels)))
                        await send(pubsub, command, *channels)

                    async def counted_read(thread: str, after: str) -> Any:
                        reads.append(thread)
                        return await read_one(thread, after)

                    def counted_pipeline(**kwargs: Any) -> Any:
                        pipelines.append(None)
                        return pipeline(**kwargs)

                    monkeypatch.setattr(module, "_channel_command", counted_send)
                    monkeypatch.setattr(follower._client, "pipeline", counted_pipeline)
                    monkeypatch.setattr(follower, "_read", counted_read)
                    written.set()
    finally:
        await store.aclose()
    assert got == {t: [1] for t in threads}
    subscribes = [n for command, n in commands if command.endswith("SUBSCRIBE")
                  and "UN" not in command]
    assert sum(subscribes) == len(threads)
    if not cluster:
        assert subscribes == [len(threads)]
    assert (len(pipelines), reads) == (len(nodes), [])  # one re-homing per node lost
