"""``python -m signals`` against the real redis-server of the test session (subprocesses)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from leases import RedisLeaseProvider
from pubsub import RedisStreamsPubSub
from signals import EntryMode, RedisSignalStore, Run, Signal, SignalRuntime
from signals.cli._main import Prefixes, _redact, main
from signals.kit import PartIn, RunRef
from tests._cli import ROOT, cli
from tests._redis_server import RedisServer, free_port

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    import redis.asyncio
    from anyio.abc import ByteReceiveStream

pytestmark = [pytest.mark.anyio, pytest.mark.redis]



def _row(row: dict[str, Any]) -> dict[str, Any]:
    """The keys ``threads --json`` had before it grew the runtime columns."""
    return {k: row[k] for k in ("thread_key", "pending_count", "owner")}


@pytest.fixture
async def parts(
    redis_client: redis.asyncio.Redis, key_prefix: str
) -> AsyncIterator[tuple[RedisLeaseProvider, RedisSignalStore]]:
    """The lease provider and store exactly as the runtime builds them on RedisStreamsPubSub."""
    prefixes = Prefixes.for_pubsub(key_prefix)
    leases = RedisLeaseProvider(client=redis_client, key_prefix=prefixes.lease)
    yield leases, RedisSignalStore(client=redis_client, key_prefix=prefixes.inbox, leases=leases)


async def test_inspect_shows_lease_and_queued_signals(
    parts: tuple[RedisLeaseProvider, RedisSignalStore], redis_url: str, key_prefix: str
) -> None:
    leases, inbox = parts
    grant = await leases.acquire_lease("t-1", "run-abc", 60_000)
    assert grant.acquired
    for i in range(3):
        mode: EntryMode = "queue" if i == 2 else "deliver"
        await inbox.accept("t-1", Signal({"i": i}, type="user", id=f"sig-{i}"), mode)

    text = cli("inspect", "t-1", "--redis-url", redis_url, "--key-prefix", key_prefix)
    assert text.returncode == 0, text.stderr
    assert "owner=run-abc" in text.stdout
    assert f"token={grant.token}" in text.stdout
    assert "queued:  3 signal(s)" in text.stdout
    assert "id=sig-0" in text.stdout and "mode=queue" in text.stdout

    raw = cli("inspect", "t-1", "--redis-url", redis_url, "--key-prefix", key_prefix, "--json",
              "--limit", "2")
    assert raw.returncode == 0, raw.stderr
    report = json.loads(raw.stdout)
    assert report["thread_key"] == "t-1"
    assert report["lease"]["owner"] == "run-abc"
    assert report["lease"]["token"] == grant.token
    assert 0 < report["lease"]["ttl_ms"] <= 60_000
    assert report["pending_count"] == 3
    assert [s["id"] for s in report["signals"]] == ["sig-0", "sig-1"]
    assert [s["mode"] for s in report["signals"]] == ["deliver", "deliver"]
    assert {"entry_id", "type", "created_at"} <= set(report["signals"][0])


async def test_inspect_matches_a_live_runtime_on_redis_streams_pubsub(
    redis_url: str, key_prefix: str
) -> None:
    """The CLI's default key layout is the one SignalRuntime uses on RedisStreamsPubSub."""
    release = anyio.Event()
    started = anyio.Event()

    async def agent(run: Run) -> None:
        async for _ in run:
            started.set()
            await release.wait()

    async with RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix) as pubsub, SignalRuntime(
        pubsub=pubsub, agent=agent
    ) as runtime:
        woke = await runtime.send("live", Signal("first", id="first"))
        assert woke.outcome == "wake"
        await started.wait()
        for i in range(2):
            queued = await runtime.send("live", Signal(i, id=f"next-{i}"), if_active="queue")
            assert queued.outcome == "queued"
        info = runtime.active_run("live")
        assert info is not None
        result = await anyio.to_thread.run_sync(
            lambda: cli("inspect", "live", "--redis-url", redis_url, "--key-prefix", key_prefix,
                        "--json")
        )
        threads = await anyio.to_thread.run_sync(
            lambda: cli("threads", "--redis-url", redis_url, "--key-prefix", key_prefix, "--json")
        )
        release.set()
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["lease"]["owner"] == woke.run_id == info.run_id
    assert report["lease"]["token"] == info.token
    assert report["pending_count"] == 3  # the in-flight signal stays until it is committed
    assert [s["id"] for s in report["signals"]] == ["first", "next-0", "next-1"]
    assert [s["mode"] for s in report["signals"]] == ["deliver", "queue", "queue"]
    assert threads.returncode == 0, threads.stderr
    [row] = json.loads(threads.stdout)
    assert _row(row) == {"thread_key": "live", "pending_count": 3, "owner": woke.run_id}
    assert row["runtime_id"] == runtime.runtime_id and row["pid"] == os.getpid()


async def test_inspect_free_thread(redis_url: str, key_prefix: str) -> None:
    result = cli("inspect", "nobody-here", "--redis-url", redis_url, "--key-prefix", key_prefix,
                 "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "thread_key": "nobody-here", "lease": None, "pending_count": 0, "signals": []
    }


async def test_threads_lists_threads_with_pending_signals(
    parts: tuple[RedisLeaseProvider, RedisSignalStore], redis_url: str, key_prefix: str
) -> None:
    leases, inbox = parts
    await inbox.accept("a", Signal("x"), "deliver")
    await inbox.accept("b", Signal("y"), "deliver")
    await inbox.accept("b", Signal("z"), "queue")
    await leases.acquire_lease("b", "run-b", 60_000)

    result = cli("threads", "--redis-url", redis_url, "--key-prefix", key_prefix, "--json")
    assert result.returncode == 0, result.stderr
    rows = {r["thread_key"]: _row(r) for r in json.loads(result.stdout)}
    assert rows == {
        "a": {"thread_key": "a", "pending_count": 1, "owner": None},
        "b": {"thread_key": "b", "pending_count": 2, "owner": "run-b"},
    }
    text = cli("threads", "--redis-url", redis_url, "--key-prefix", key_prefix)
    assert text.returncode == 0 and "run-b" in text.stdout and "THREAD" in text.stdout


def test_unreachable_redis_exits_2_without_traceback() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    for args in (["inspect", "t"], ["threads"]):
        result = cli(*args, "--redis-url", url)
        assert result.returncode == 2, result
        assert "cannot reach Redis" in result.stderr
        assert "Traceback" not in result.stderr


def test_usage_errors_exit_1() -> None:
    assert cli("inspect", "t").returncode == 1  # no --redis-url, no $REDIS_URL
    bad = cli("inspect", "t", "--redis-url", "nonsense://x")
    assert bad.returncode == 1 and "invalid Redis URL" in bad.stderr
    assert "Traceback" not in bad.stderr
    assert cli("inspect", "", "--redis-url", "redis://127.0.0.1:1/0").returncode == 1


def test_main_in_process(
    redis_url: str, key_prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["threads", "--redis-url", redis_url, "--key-prefix", key_prefix]) == 0
    assert "no thread has pending signals" in capsys.readouterr().out


def test_redact_hides_the_password() -> None:
    assert _redact("redis://user:secret@host:6379/0") == "redis://user:***@host:6379/0"
    assert _redact("redis://host:6379/0") == "redis://host:6379/0"


def test_console_script_is_declared() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'signals = "signals.cli:main"' in pyproject
    assert "signals-inspect" not in pyproject  # one command, named like the module


def test_console_script_runs() -> None:
    script = Path(sys.executable).parent / "signals"
    if not script.exists():
        pytest.skip("the package is not installed with its console script")
    url = f"redis://127.0.0.1:{free_port()}/0"
    result = subprocess.run(
        [str(script), "threads", "--redis-url", url], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "cannot reach Redis" in result.stderr, result
    usage = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 0 and usage.stdout.startswith("usage: signals "), usage


async def test_receipt_and_dead_letters(
    parts: tuple[RedisLeaseProvider, RedisSignalStore], redis_url: str, key_prefix: str
) -> None:
    _, store = parts
    await store.accept("t", Signal("x", id="poison"), "deliver")
    assert (await store.take("t", RunRef("r1/1", None), max_attempts=5, first=True)).entries
    await store.settle("t", RunRef("r1/1", None), failed=["poison"], error="ValueError: nope")
    taken = await store.take("t", RunRef("r2/1", None), max_attempts=1, first=True)
    assert taken.dead == ("poison",)
    base = ["--redis-url", redis_url, "--key-prefix", key_prefix]
    receipt = cli("receipt", "t", "poison", *base, "--json")
    assert receipt.returncode == 0, receipt.stderr
    assert json.loads(receipt.stdout)["status"] == "dead_lettered"
    assert cli("receipt", "t", "never-sent", *base).returncode == 3
    listed = json.loads(cli("dead-letters", "t", *base, "--json").stdout)
    rows = [(d["id"], d["error"]) for d in listed["dead_letters"]]
    assert rows == [("poison", "ValueError: nope")]
    retried = json.loads(cli("dead-letters", "t", "--retry", "poison", *base, "--json").stdout)
    assert retried["retried"] == ["poison"] and retried["dead_letters"] == []
    assert (await store.describe(["t"]))["t"].pending == 1
    taken = await store.take("t", RunRef("r3/1", None), max_attempts=0, first=True)
    assert taken.dead == ("poison",)
    purged = cli("dead-letters", "t", "--purge", *base)
    assert purged.returncode == 0 and "purged: 1" in purged.stdout


# -- control commands ---------------------------------------------------------------------------


async def test_schedules_and_unschedule(redis_url: str, key_prefix: str) -> None:
    async with RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix) as ps, SignalRuntime(
        pubsub=ps, agent=None
    ) as rt:
        await rt.schedule("digest", "inbox", Signal({"d": 1}), cron="0 8 * * *", tz="Europe/Paris")
    base = ["--redis-url", redis_url, "--key-prefix", key_prefix]
    listed = json.loads(cli("schedules", *base, "--json").stdout)["schedules"]
    assert [(s["schedule_id"], s["thread_key"], s["cron"], s["tz"]) for s in listed] == [
        ("digest", "inbox", "0 8 * * *", "Europe/Paris")]
    text = cli("schedules", *base).stdout
    assert "digest" in text and "cron 0 8 * * * (Europe/Paris)" in text, text
    gone = cli("unschedule", "digest", *base)
    assert gone.returncode == 0 and "removed schedule 'digest'" in gone.stdout, gone
    again = cli("unschedule", "digest", *base)
    assert again.returncode == 3 and "no schedule 'digest'" in again.stderr, again
    assert cli("schedules", *base).stdout.strip() == "no schedules"


async def test_pause_and_resume(
    parts: tuple[RedisLeaseProvider, RedisSignalStore], redis_url: str, key_prefix: str
) -> None:
    _, store = parts
    await store.accept("t", Signal("x", id="s1"), "deliver")
    base = ["--redis-url", redis_url, "--key-prefix", key_prefix]
    paused = cli("pause", "t", *base)
    assert paused.returncode == 0 and paused.stdout.strip() == "paused 't'", paused
    assert (await store.describe(["t"]))["t"].paused
    assert not (await store.take("t", RunRef("r1/1", None), max_attempts=5, first=True)).entries
    again = json.loads(cli("pause", "t", *base, "--json").stdout)
    assert again == {"thread_key": "t", "paused": True, "was_paused": True}
    resumed = cli("resume", "t", *base)
    assert resumed.returncode == 0 and resumed.stdout.strip() == "resumed 't'", resumed
    assert not (await store.describe(["t"]))["t"].paused
    assert cli("resume", "t", *base).stdout.strip() == "'t' was not paused"
    assert cli("pause", "", *base).returncode == 1


async def in_thread(*args: str) -> subprocess.CompletedProcess[str]:
    """``cli(*args)`` without blocking the event loop (a runtime of the test may be running)."""
    return await anyio.to_thread.run_sync(lambda: cli(*args))


async def test_threads_active_and_idle(
    parts: tuple[RedisLeaseProvider, RedisSignalStore], redis_url: str, key_prefix: str
) -> None:
    _, store = parts
    base = ["--redis-url", redis_url, "--key-prefix", key_prefix]
    release, started = anyio.Event(), anyio.Event()

    async def agent(run: Run) -> None:
        async for _ in run:
            started.set()
            await release.wait()

    # max_concurrent_runs=1: while "busy" runs, the worker never claims "waiting".
    async with RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix) as pubsub, SignalRuntime(
        pubsub=pubsub, agent=agent, max_concurrent_runs=1
    ) as runtime:
        woke = await runtime.send("busy", Signal("go", id="go"))
        with anyio.fail_after(10):
            await started.wait()
        await store.accept("waiting", Signal("later", id="later"), "deliver")
        active = await in_thread("threads", "--active", "--json", *base)
        idle = await in_thread("threads", "--idle", "--json", *base)
        both = await in_thread("threads", "--json", *base)
        text = await in_thread("threads", "--active", *base)
        release.set()
    assert active.returncode == 0, active.stderr
    [row] = json.loads(active.stdout)
    assert row["thread_key"] == "busy" and row["owner"] == woke.run_id
    assert row["runtime_id"] == runtime.runtime_id
    assert (row["host"], row["pid"]) == (socket.gethostname(), os.getpid())
    assert row["pending_count"] == 1
    assert row["since"] is not None and row["last_activity"] is not None
    assert [_row(r) for r in json.loads(idle.stdout)] == [
        {"thread_key": "waiting", "pending_count": 1, "owner": None}
    ]
    assert [r["thread_key"] for r in json.loads(both.stdout)] == ["busy", "waiting"]
    assert text.returncode == 0, text.stderr
    header, line = text.stdout.splitlines()
    assert header.split() == ["THREAD", "OWNER", "RUN", "RUNTIME", "HOST", "PID", "SINCE",
                              "PENDING", "LAST", "ACTIVITY"]
    assert line.split()[:5] == ["busy", woke.run_id, runtime.runtime_id, socket.gethostname(),
                                str(os.getpid())]


async def test_threads_and_inspect_with_custom_prefixes(
    redis_client: redis.asyncio.Redis, redis_url: str, key_prefix: str
) -> None:
    leases = RedisLeaseProvider(client=redis_client, key_prefix=f"{key_prefix}-L")
    store = RedisSignalStore(client=redis_client, key_prefix=f"{key_prefix}-I", leases=leases)
    await store.accept("t", Signal("x", id="x"), "deliver")
    grant = await leases.acquire_lease("t", "rt-1/1", 60_000)
    base = ["--redis-url", redis_url, "--key-prefix", key_prefix,
            "--lease-prefix", f"{key_prefix}-L", "--inbox-prefix", f"{key_prefix}-I"]
    report = json.loads(cli("inspect", "t", "--json", *base).stdout)
    assert report["lease"]["owner"] == "rt-1/1" and report["lease"]["token"] == grant.token
    assert [s["id"] for s in report["signals"]] == ["x"]
    rows = json.loads(cli("threads", "--json", *base).stdout)
    assert [_row(r) for r in rows] == [{"thread_key": "t", "pending_count": 1, "owner": "rt-1/1"}]
    assert rows[0]["runtime_id"] == "rt-1"
    # The default layout does not see them.
    assert json.loads(cli("threads", "--json", "--redis-url", redis_url, "--key-prefix",
                          key_prefix).stdout) == []


async def test_pending_lists_modes_and_attempts(
    parts: tuple[RedisLeaseProvider, RedisSignalStore], redis_url: str, key_prefix: str
) -> None:
    _, store = parts
    base = ["--redis-url", redis_url, "--key-prefix", key_prefix]
    await store.accept("t", Signal({"n": 1}, id="first"), "deliver")
    await store.accept("t", Signal({"n": 2}, type="system", id="second"), "queue")
    [first] = (await store.take("t", RunRef("rt-x/1", None), max_attempts=5,
                                first=True)).entries
    assert first.signal.id == "first" and first.attempts == 1

    raw = cli("pending", "t", "--json", *base)
    assert raw.returncode == 0, raw.stderr
    listed = json.loads(raw.stdout)
    assert listed["thread_key"] == "t"
    assert [(s["id"], s["type"], s["mode"], s["attempt"]) for s in listed["pending"]] == [
        ("first", "user", "deliver", 1), ("second", "system", "queue", 0)
    ]
    assert listed["pending"][1]["payload"] == {"n": 2}
    text = cli("pending", "t", *base)
    assert text.returncode == 0, text.stderr
    assert [line.split() for line in text.stdout.splitlines()] == [
        ["ID", "TYPE", "MODE", "ATTEMPT"], ["first", "user", "deliver", "1"],
        ["second", "system", "queue", "0"],
    ]
    empty = cli("pending", "nobody", *base)
    assert empty.returncode == 0 and "no pending signals" in empty.stdout


async def test_cancel_queued_and_unknown_ids(
    parts: tuple[RedisLeaseProvider, RedisSignalStore], redis_url: str, key_prefix: str
) -> None:
    _, store = parts
    base = ["--redis-url", redis_url, "--key-prefix", key_prefix]
    for sid in ("q1", "q2", "q3"):
        await store.accept("t", Signal(sid, id=sid), "queue")

    done = cli("cancel", "t", "q1", "--json", *base)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"thread_key": "t", "cancelled": ["q1"], "not_cancelled": []}
    receipt = await store.receipt("t", "q1")
    assert receipt is not None and receipt.status == "cancelled"

    partly = cli("cancel", "t", "q2", "nope", *base)
    assert partly.returncode == 0, partly.stderr
    assert partly.stdout.split() == ["q2"]
    assert "nope" in partly.stderr and "Traceback" not in partly.stderr

    for ids in (["nope"], ["q1"]):  # unknown; already cancelled
        none = cli("cancel", "t", *ids, *base)
        assert none.returncode == 3, none
        assert none.stdout == "" and len(none.stderr.splitlines()) == 1
    assert [e.signal.id for e in await store.entries("t")] == ["q3"]


async def test_abort_a_live_run_in_a_worker(redis_url: str, key_prefix: str) -> None:
    base = ["--redis-url", redis_url, "--key-prefix", key_prefix]
    emitted = anyio.Event()

    async def agent(run: Run) -> None:
        async for sig in run:
            await run.emit({"working_on": sig.id}, signal=sig)
            emitted.set()
            await anyio.sleep(3600)

    async with RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix) as pubsub, SignalRuntime(
        pubsub=pubsub, agent=agent
    ) as worker:
        woke = await worker.send("live", Signal("job", id="job"))
        later = await worker.send("live", Signal("later", id="later"), if_active="queue")
        assert (woke.outcome, later.outcome) == ("wake", "queued")
        with anyio.fail_after(10):
            await emitted.wait()

        wrong = await in_thread("abort", "live", "--run", "rt-nobody/1", *base)
        held = await in_thread("cancel", "live", "job", *base)  # a live run holds it
        aborted = await in_thread("abort", "live", "--run", str(woke.run_id), "--clear",
                                  "--reason", "operator", "--json", *base)
        assert aborted.returncode == 0, aborted.stderr
        cancelled = None
        with anyio.fail_after(10):
            async for part in worker.stream("live"):
                if part.kind == "run.cancelled":
                    cancelled = part
                    break
            await worker.wait_idle("live")
        tail = await in_thread("tail", "live", "--no-follow", "--json", *base)
        pending = await in_thread("pending", "live", "--json", *base)
        again = await in_thread("abort", "live", *base)
    assert wrong.returncode == 3 and "no active run" in wrong.stderr, wrong
    assert held.returncode == 3, held
    assert json.loads(aborted.stdout) == {
        "thread_key": "live", "run_id": woke.run_id, "aborted": True, "clear_pending": True,
        "reason": "operator",
    }
    assert cancelled is not None and cancelled.run_id == woke.run_id
    assert cancelled.data == {"reason": "abort: operator"}
    kinds = [(p["kind"], p["run_id"]) for p in map(json.loads, tail.stdout.splitlines())]
    assert ("run.cancelled", woke.run_id) in kinds
    assert ("part", woke.run_id) in kinds
    assert json.loads(pending.stdout)["pending"] == []  # --clear withdrew job and later
    assert again.returncode == 3 and again.stdout == "", again


async def test_tail_no_follow_prints_one_line_per_part(
    parts: tuple[RedisLeaseProvider, RedisSignalStore], redis_url: str, key_prefix: str
) -> None:
    _, store = parts
    base = ["--redis-url", redis_url, "--key-prefix", key_prefix]
    cursors = await store.emit("t", [
        PartIn("run.started", "rt-a/1", None, '{"runs":1}'),
        PartIn("part", "rt-a/1", "s1", '{"text":"hello world"}'),
        PartIn("part", "rt-a/1", None, None),
    ])
    text = cli("tail", "t", "--no-follow", *base)
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines() == [
        f'{cursors[0]} run.started rt-a/1 - {{"runs":1}}',
        f'{cursors[1]} part rt-a/1 s1 {{"text":"hello world"}}',
        f"{cursors[2]} part rt-a/1 - null",
    ]
    raw = cli("tail", "t", "--no-follow", "--json", "--after", cursors[0], *base)
    assert raw.returncode == 0, raw.stderr
    rows = [json.loads(line) for line in raw.stdout.splitlines()]
    assert [(r["cursor"], r["kind"], r["signal_id"], r["data"]) for r in rows] == [
        (cursors[1], "part", "s1", {"text": "hello world"}), (cursors[2], "part", None, None)
    ]
    assert rows[0]["thread_key"] == "t" and rows[0]["run_id"] == "rt-a/1"
    assert isinstance(rows[0]["at"], float)
    empty = cli("tail", "nothing-here", "--no-follow", *base)
    assert (empty.returncode, empty.stdout) == (0, "")


async def test_tail_follows_live_parts_until_sigint(
    parts: tuple[RedisLeaseProvider, RedisSignalStore], redis_url: str, key_prefix: str
) -> None:
    _, store = parts
    [first] = await store.emit("t", [PartIn("part", "rt-a/1", None, '"before"')])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "signals", "tail", "t", "--json", "--redis-url", redis_url,
               "--key-prefix", key_prefix]
    async with await anyio.open_process(command, env=env, cwd=ROOT) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        lines = BufferedByteReceiveStream(proc.stdout)
        try:
            with anyio.fail_after(30):
                line = json.loads(await lines.receive_until(b"\n", 1 << 20))
                assert line["cursor"] == first  # printed: the SIGINT handler is in place
                [second] = await store.emit("t", [PartIn("part", "rt-a/1", None, '"live"')])
                line = json.loads(await lines.receive_until(b"\n", 1 << 20))
                assert (line["cursor"], line["data"]) == (second, "live")
            assert proc.returncode is None  # still following
            proc.send_signal(signal.SIGINT)
            with anyio.fail_after(30):
                assert await proc.wait() == 0
                assert await _rest(lines) == b""
                assert await _rest(proc.stderr) == b""  # quietly: no traceback, no message
        finally:
            if proc.returncode is None:
                proc.kill()


async def _rest(stream: ByteReceiveStream) -> bytes:
    data = b""
    with contextlib.suppress(anyio.EndOfStream, anyio.IncompleteRead):
        while True:
            data += await stream.receive()
    return data


async def test_tail_after_a_trimmed_cursor_exits_3(
    redis_client: redis.asyncio.Redis, redis_url: str, key_prefix: str
) -> None:
    small = RedisSignalStore(client=redis_client, key_prefix=Prefixes.for_pubsub(key_prefix).inbox,
                             stream_max_parts=3)
    cursors = [(await small.emit("t", [PartIn("part", "rt-a/1", None, str(i))]))[0]
               for i in range(6)]
    base = ["--redis-url", redis_url, "--key-prefix", key_prefix]
    for follow in ([], ["--no-follow"]):
        expired = cli("tail", "t", "--after", cursors[0], *follow, *base)
        assert expired.returncode == 3, expired
        assert expired.stdout == "" and "Traceback" not in expired.stderr
        [message] = expired.stderr.splitlines()
        assert cursors[0] in message
    kept = cli("tail", "t", "--after", cursors[-2], "--no-follow", *base)
    assert kept.returncode == 0 and kept.stdout.split()[0] == cursors[-1], kept


def test_refused_requests_exit_4(private_redis_server: RedisServer) -> None:
    import redis

    port = private_redis_server.port
    wrong_db = cli("threads", "--redis-url", f"redis://127.0.0.1:{port}/99")
    assert wrong_db.returncode == 4, wrong_db
    client = redis.Redis(port=port)
    try:
        client.config_set("requirepass", "s3cret")
        for url in (f"redis://:wrong-pw@127.0.0.1:{port}/0", f"redis://127.0.0.1:{port}/0"):
            for args in (["threads"], ["inspect", "t"], ["tail", "t"], ["cancel", "t", "x"]):
                result = cli(*args, "--redis-url", url)
                assert result.returncode == 4, result
                assert result.stdout == "" and "Traceback" not in result.stderr
                [message] = result.stderr.splitlines()
                assert "refused" in message and "wrong-pw" not in message
        ok = cli("threads", "--redis-url", f"redis://:s3cret@127.0.0.1:{port}/0")
        assert ok.returncode == 0, ok
    finally:
        client.config_set("requirepass", "")  # this connection authenticated before the change
        client.close()


def test_every_command_exits_2_when_redis_is_unreachable() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    commands = (["pending", "t"], ["cancel", "t", "x"], ["abort", "t"], ["tail", "t"],
                ["receipt", "t", "x"], ["dead-letters", "t"], ["threads", "--active"])
    for args in commands:
        result = cli(*args, "--redis-url", url)
        assert result.returncode == 2, result
        [message] = result.stderr.splitlines()
        assert "cannot reach Redis" in message and result.stdout == ""


def test_control_usage_errors_exit_1() -> None:
    url = ["--redis-url", "redis://127.0.0.1:1/0"]  # never reached: arguments are checked first
    for args in (["cancel", "t"], ["threads", "--active", "--idle"], ["tail", "t", "--after", "x"],
                 ["abort", "t", "--reason", ""], ["pending", ""], ["abort", "t", "--run", ""]):
        result = cli(*args, *url)
        assert result.returncode == 1, result
        assert "Traceback" not in result.stderr
    secret = cli("threads", "--redis-url", "nonsense://user:hunter2@host")
    assert secret.returncode == 1 and "hunter2" not in secret.stderr, secret


def test_help_documents_commands_and_exit_codes() -> None:
    usage = cli("--help")
    assert usage.returncode == 0
    for word in ("threads", "pending", "cancel", "abort", "tail", "receipt", "dead-letters",
                 "inspect", "Exit codes", "130"):
        assert word in usage.stdout
