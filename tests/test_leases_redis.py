"""RedisLeaseProvider on a real redis-server: the conformance suite plus Redis specifics."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import pytest
import redis.asyncio
import redis.exceptions
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from leases import (
    BackendUnavailableError,
    LeaseKeeper,
    LeaseProvider,
    RedisLeaseProvider,
    UnsupportedBackendError,
)
from leases.testing import LeaseProviderConformance
from tests._redis_server import RedisServer, free_port

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = [pytest.mark.anyio, pytest.mark.redis]



class TestRedisConformance(LeaseProviderConformance):
    @pytest.fixture(params=[False, True], ids=["bytes", "decoded"])
    async def provider(
        self, request: pytest.FixtureRequest, redis_url: str, key_prefix: str
    ) -> AsyncIterator[LeaseProvider]:
        client = redis.asyncio.Redis.from_url(redis_url, decode_responses=request.param)
        try:
            yield RedisLeaseProvider(client=client, key_prefix=key_prefix)
        finally:
            await client.aclose()


class TestRedisResp3Conformance(LeaseProviderConformance):
    racers = 20

    @pytest.fixture
    async def provider(self, redis_url: str, key_prefix: str) -> AsyncIterator[LeaseProvider]:
        client = redis.asyncio.Redis.from_url(redis_url, protocol=3)
        try:
            yield RedisLeaseProvider(client=client, key_prefix=key_prefix)
        finally:
            await client.aclose()


@pytest.fixture
async def provider(redis_url: str, key_prefix: str) -> AsyncIterator[RedisLeaseProvider]:
    async with RedisLeaseProvider(url=redis_url, key_prefix=key_prefix) as p:
        yield p


async def test_key_layout_and_the_fence_counter_outlive_the_lease(
    provider: RedisLeaseProvider, redis_client: redis.asyncio.Redis, key_prefix: str
) -> None:
    assert provider.lease_key("t1") == f"{key_prefix}:{{t1}}"
    assert provider.fence_key("t1") == f"{key_prefix}:{{t1}}:fence"
    first = await provider.acquire_lease("t1", "a", 50)
    assert await redis_client.hgetall(f"{key_prefix}:{{t1}}") == {b"owner": b"a", b"token": b"1"}
    assert 0 < await redis_client.pttl(f"{key_prefix}:{{t1}}") <= 50
    assert await redis_client.pttl(f"{key_prefix}:{{t1}}:fence") == -1  # no expiry
    await anyio.sleep(0.08)
    assert await redis_client.exists(f"{key_prefix}:{{t1}}") == 0
    assert await redis_client.get(f"{key_prefix}:{{t1}}:fence") == b"1"
    second = await provider.acquire_lease("t1", "b", 1000)
    assert (first.token, second.token) == (1, 2)


async def test_lease_info(provider: RedisLeaseProvider) -> None:
    assert await provider.lease_info("k") is None
    await provider.acquire_lease("k", "a", 5000)
    info = await provider.lease_info("k")
    assert info is not None
    assert (info.key, info.owner, info.token) == ("k", "a", 1)
    assert info.ttl_ms_remaining is not None and 4000 < info.ttl_ms_remaining <= 5000
    assert await provider.transfer_lease("k", "a", "b", 9000)
    moved = await provider.lease_info("k")
    assert moved is not None and (moved.owner, moved.token) == ("b", 2)
    assert moved.ttl_ms_remaining is not None and moved.ttl_ms_remaining > 5000


async def test_replayed_calls_are_idempotent(provider: RedisLeaseProvider) -> None:
    first = await provider.acquire_lease("k", "a", 5000)
    assert await provider.acquire_lease("k", "a", 5000) == first  # replayed acquire
    assert await provider.transfer_lease("k", "a", "b", 5000)
    assert await provider.transfer_lease("k", "a", "b", 5000)  # replayed transfer: still True
    info = await provider.lease_info("k")
    assert info is not None and info.owner == "b" and info.token == 2  # no second bump
    await provider.release_lease("k", "b")
    await provider.release_lease("k", "b")  # replayed release: a no-op


async def test_special_characters_in_keys_and_owners(provider: RedisLeaseProvider) -> None:
    for key in ["a:b", "{x}", "}", "ünï cødé", "a" * 500]:
        owner = f"owner {key}"
        assert (await provider.acquire_lease(key, owner, 5000)).owner == owner
        assert await provider.get_lease_owner(key) == owner


async def test_a_client_it_was_given_stays_open(redis_url: str, key_prefix: str) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        async with RedisLeaseProvider(client=client, key_prefix=key_prefix) as p:
            await p.acquire_lease("k", "a", 1000)
        assert await client.ping()
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({}, TypeError),
        ({"url": "redis://127.0.0.1:1/0", "client": object()}, TypeError),
        ({"url": ""}, ValueError),
        ({"url": b"redis://x"}, TypeError),
        ({"url": "redis://127.0.0.1:1/0", "key_prefix": ""}, ValueError),
    ],
)
def test_constructor_arguments(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        RedisLeaseProvider(**kwargs)


async def test_unreachable_redis_raises_backend_unavailable() -> None:
    client = redis.asyncio.Redis(
        port=free_port(), socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0)
    )
    p = RedisLeaseProvider(client=client)
    try:
        for call in (
            p.acquire_lease("k", "a", 100),
            p.get_lease_owner("k"),
            p.renew_lease("k", "a", 100),
            p.release_lease("k", "a"),
            p.transfer_lease("k", "a", "b", 100),
            p.lease_info("k"),
        ):
            with pytest.raises(BackendUnavailableError) as info:
                await call
            assert isinstance(info.value.__cause__, redis.exceptions.ConnectionError)
            assert "'k'" in str(info.value)
    finally:
        await client.aclose()


async def test_validation_happens_before_any_io() -> None:
    p = RedisLeaseProvider(client=redis.asyncio.Redis(port=free_port()))
    with pytest.raises(ValueError, match="ttl_ms"):
        await p.acquire_lease("k", "a", 0)
    with pytest.raises(ValueError, match="key"):
        await p.get_lease_owner("")


async def test_survives_a_server_restart(private_redis_server: RedisServer) -> None:
    """Scripts vanish with the restart (no persistence): loaded again on NOSCRIPT."""
    client = redis.asyncio.Redis.from_url(
        private_redis_server.url, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0)
    )
    p = RedisLeaseProvider(client=client)
    try:
        assert (await p.acquire_lease("k", "a", 5000)).token == 1
        private_redis_server.stop()
        with pytest.raises(BackendUnavailableError):
            await p.renew_lease("k", "a", 5000)
        private_redis_server.start()
        assert await p.get_lease_owner("k") is None  # no persistence: the lease is gone
        result = await p.acquire_lease("k", "b", 5000)
        assert result.acquired and result.token == 1  # ...and so is the counter: see docs
    finally:
        await client.aclose()


def test_under_trio_it_refuses_clearly(redis_url: str) -> None:
    async def main() -> None:
        p = RedisLeaseProvider(url=redis_url)
        with pytest.raises(UnsupportedBackendError, match="asyncio"):
            await p.acquire_lease("k", "a", 100)
        with pytest.raises(UnsupportedBackendError):
            async with p:
                pass

    anyio.run(main, backend="trio")


async def test_keeper_on_redis_renews_and_detects_a_deleted_lease(
    provider: RedisLeaseProvider, redis_client: redis.asyncio.Redis
) -> None:
    async with LeaseKeeper(provider, "k", "a", 100) as keeper:
        await anyio.sleep(0.25)  # > 2 TTLs: renewals keep it
        assert await provider.get_lease_owner("k") == "a"
    assert not keeper.lost
    assert await provider.get_lease_owner("k") is None  # released

    async with LeaseKeeper(provider, "k", "a", 100) as keeper:
        await redis_client.delete(provider.lease_key("k"))  # an operator deletes it by hand
        await anyio.sleep(5)
    assert keeper.lost and keeper.lost_reason == "renew rejected"


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_busy_pool_is_latency_never_an_error(anyio_backend: str, redis_url: str,
                                                     key_prefix: str) -> None:
    """A client built from ``url`` has ``max_connections`` connections; more concurrent
    callers wait for one instead of failing, and a connection given back wakes a waiter at
    once (never only at the next release or at the pool's timeout)."""
    async with RedisLeaseProvider(url=redis_url, key_prefix=key_prefix, max_connections=2,
                                  socket_timeout=1) as provider:
        pool: Any = provider.client.connection_pool

        async def cycle(n: int) -> None:
            for _ in range(20):
                assert (await provider.acquire_lease(f"k{n}", "o", 10_000)).acquired
                await provider.release_lease(f"k{n}", "o")

        async with anyio.create_task_group() as tg:
            for n in range(16):
                tg.start_soon(cycle, n)
        assert len(pool._available_connections) + len(pool._in_use_connections) <= 2

        held = [await pool.get_connection() for _ in range(2)]
        got: list[float] = []

        async def waiter() -> None:
            connection = await pool.get_connection()
            got.append(anyio.current_time())
            await pool.release(connection)

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            tg.start_soon(waiter)
            await anyio.sleep(0.2)
            assert got == []  # both wait: the pool is full
            released = anyio.current_time()
            await pool.release(held.pop())
            await anyio.sleep(0.1)
            assert len(got) == 2 and got[0] - released < 0.1  # woken by that release
        await pool.release(held.pop())


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("cluster", [False, pytest.param(True, marks=pytest.mark.cluster)])
async def test_a_command_is_written_without_a_timer_unless_the_write_could_wait(
    anyio_backend: str, cluster: bool, request: pytest.FixtureRequest, key_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """redis-py bounds each write with ``asyncio.wait_for`` (a task per command on Python
    3.11). A client built from ``url`` writes a command that cannot wait (an empty transport
    buffer, a command below its high-water mark) straight to the transport: no timer. A large
    command still takes redis-py's path, its write timeout included; a plain redis-py client
    (the control) pays the timer on every command."""
    import asyncio

    url = request.getfixturevalue("cluster_url" if cluster else "redis_url")
    timers: list[float] = []
    wait_for = asyncio.wait_for  # (what redis-py's connections call: the module's attribute)

    async def counted(awaitable: Any, timeout: float | None) -> Any:
        timers.append(timeout or 0.0)
        return await wait_for(awaitable, timeout)

    monkeypatch.setattr(asyncio, "wait_for", counted)
    async with RedisLeaseProvider(url=url, key_prefix=key_prefix, cluster=cluster,
                                  socket_timeout=2) as provider:
        for _ in range(2):  # the first connects (to each node) and loads the scripts
            timers.clear()
            for n in range(20):
                assert (await provider.acquire_lease(f"k{n}", "o", 10_000)).acquired
                await provider.release_lease(f"k{n}", "o")
        assert timers == []
        big = "x" * (1 << 17)  # over the transport's high-water mark (64 KiB)
        await provider.client.set(f"{{{key_prefix}}}big", big)
        assert timers == [2.0]
        assert await provider.client.get(f"{{{key_prefix}}}big") == big.encode()
        await provider.client.delete(f"{{{key_prefix}}}big")
    if not cluster:
        plain = redis.asyncio.Redis.from_url(url, socket_timeout=2)
        try:
            await plain.ping()  # connected
            timers.clear()
            for _ in range(5):
                await plain.ping()
            assert len(timers) == 5
        finally:
            await plain.aclose()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("packer", ["hiredis", "python"])
@pytest.mark.parametrize("cluster", [False, pytest.param(True, marks=pytest.mark.cluster)])
async def test_a_command_is_packed_without_redis_pys_encoder(
    anyio_backend: str, packer: str, cluster: bool, request: pytest.FixtureRequest,
    key_prefix: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """redis-py runs its Python encoder on every argument of every command (a script call of
    ours has about 50), even when hiredis packs the command. A client built from ``url``
    packs ``str``, ``bytes``, ``int`` and ``float`` without redis-py's packers (by hiredis, or
    in Python without it); other arguments take redis-py's path: converted (``memoryview``)
    or refused with its ``DataError`` (``bool``). A plain redis-py client is the control."""
    import redis.asyncio.connection

    from _signal_leases.redis import pools as redis_pools

    if packer == "python":  # as without the hiredis extra
        monkeypatch.setattr(redis.asyncio.connection, "HIREDIS_AVAILABLE", False)
        monkeypatch.setattr(redis_pools, "_hiredis_pack", None)
    else:
        pytest.importorskip("hiredis")
    url = request.getfixturevalue("cluster_url" if cluster else "redis_url")
    packed: list[tuple[Any, ...]] = []  # the commands redis-py's packing packed
    base = redis.asyncio.connection.AbstractConnection
    pack = base.pack_command  # (what a plain connection calls; ours only for a fallback)

    def counted(self: Any, *args: Any) -> Any:
        packed.append(args)
        return pack(self, *args)

    monkeypatch.setattr(base, "pack_command", counted)
    async with RedisLeaseProvider(url=url, key_prefix=key_prefix, cluster=cluster) as provider:
        key = f"{{{key_prefix}}}packed"
        for _ in range(2):  # the first connects (to each node) and loads the scripts
            packed.clear()
            for n in range(5):
                assert (await provider.acquire_lease(f"k{n}", "o", 10_000)).acquired
                await provider.renew_lease(f"k{n}", "o", 10_000)
                await provider.release_lease(f"k{n}", "o")
        for value, stored in (("é ü", "é ü".encode()), (b"\x00\xff", b"\x00\xff"),
                              (-12, b"-12"), (0.1, b"0.1"), (1e300, b"1e+300")):
            await provider.client.set(key, value)
            assert await provider.client.get(key) == stored
        assert packed == []
        await provider.client.set(key, memoryview(b"mv"))  # hiredis, or redis-py's path
        assert await provider.client.get(key) == b"mv"
        with pytest.raises(redis.exceptions.DataError, match="bool"):
            await provider.client.set(key, True)
        assert packed[-1] == ("SET", key, True)  # refused by redis-py's path
        await provider.client.script_flush()  # NOSCRIPT: loaded again, called again
        assert (await provider.acquire_lease("after-flush", "o", 10_000)).acquired
        await provider.client.delete(key)
    if not cluster:
        plain = redis.asyncio.Redis.from_url(url)
        try:
            packed.clear()
            await plain.set(key, "x")
            assert ("SET", key, "x") in packed, "the control: redis-py packs it"
            # What hiredis must not get (it crashes on the first, misreads the second): as
            # with a plain client, an error or the same value stored.
            async with RedisLeaseProvider(url=url, key_prefix=key_prefix) as provider:
                awkward: tuple[Any, ...] = (10**5000, memoryview(b"abcdef")[::2])
                for value in awkward:
                    outcomes: list[Any] = []
                    for client in (provider.client, plain):
                        try:
                            await client.set(key, value)
                            outcomes.append(await client.get(key))
                        except Exception as exc:  # (the same class from both)
                            outcomes.append(type(exc))
                    assert outcomes[0] == outcomes[1], (value, outcomes)
                await plain.delete(key)
        finally:
            await plain.aclose()


_ARG = (st.text() | st.binary() | st.integers() | st.floats()
        | st.floats(allow_nan=False).map(lambda f: f * 1e300))


@given(name=st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ", min_size=1, max_size=10),
       args=st.lists(_ARG, max_size=12))
def test_the_packers_write_what_redis_py_writes(name: str, args: list[Any]) -> None:
    """The Python packer and hiredis write byte for byte what redis-py's own packer writes,
    for the four types they take (text with any code point, floats of any size, inf, nan)."""
    import redis.asyncio.connection

    from _signal_leases.redis import pools as redis_pools

    command = (name, *args)
    connection = redis.asyncio.connection.Connection()  # (redis-py 6 packs only in Python)
    python = getattr(connection, "_pack_command_python", connection.pack_command)
    reference = b"".join(python(*command))
    assert redis_pools._pack(command) == reference
    if redis_pools._hiredis_pack is not None and redis_pools._plain(command):
        assert redis_pools._hiredis_pack(command) == reference
