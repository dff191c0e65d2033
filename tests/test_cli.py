"""``python -m signals`` against the real redis-server of the test session (subprocesses)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest

from leases import RedisLeaseProvider
from pubsub import RedisStreamsPubSub
from signals import EntryMode, RedisSignalStore, Run, Signal, SignalRuntime
from signals._cli import Prefixes, _redact, main
from tests._redis_server import free_port

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    import redis.asyncio

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

ROOT = Path(__file__).resolve().parent.parent



def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("REDIS_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "signals", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=ROOT,
    )


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
    assert json.loads(threads.stdout) == [
        {"thread_key": "live", "pending_count": 3, "owner": woke.run_id}
    ]


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
    rows = {r["thread_key"]: r for r in json.loads(result.stdout)}
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
    assert 'signals-inspect = "signals._cli:main"' in pyproject


def test_console_script_runs() -> None:
    script = Path(sys.executable).parent / "signals-inspect"
    if not script.exists():
        pytest.skip("the package is not installed with its console script")
    url = f"redis://127.0.0.1:{free_port()}/0"
    result = subprocess.run(
        [str(script), "threads", "--redis-url", url], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "cannot reach Redis" in result.stderr, result
    usage = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 0 and usage.stdout.startswith("usage: signals-inspect"), usage


async def test_receipt_and_dead_letters(
    parts: tuple[RedisLeaseProvider, RedisSignalStore], redis_url: str, key_prefix: str
) -> None:
    _, store = parts
    await store.accept("t", Signal("x", id="poison"), "deliver")
    [entry] = await store.read("t")
    await store.note_failure("t", ["poison"], "ValueError: nope")
    assert await store.deliver("t", entry.entry_id, "poison", "r1/1", max_attempts=0) == -1
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
    assert await store.pending_count("t") == 1
    assert await store.deliver("t", (await store.read("t"))[0].entry_id, "poison", "r2/1",
                               max_attempts=0) == -1
    purged = cli("dead-letters", "t", "--purge", *base)
    assert purged.returncode == 0 and "purged: 1" in purged.stdout
