"""Shared fixtures: the async backends, a real redis-server for the session, key prefixes.

``anyio_backend`` is defined here only. Every async test runs on asyncio and trio, except:
tests marked ``redis`` run on asyncio only (redis-py is asyncio-only); tests marked
``mock_clock`` also run on trio with a ``MockClock`` (virtual time, id ``trio-mockclock``); a
test may still pin it with ``@pytest.mark.parametrize("anyio_backend", [...])``. Without
``redis-server`` the Redis tests skip locally; with ``CI=true`` they fail. The same holds for
the Redis Cluster tests (marked ``cluster`` and ``redis``), which also need ``redis-cli``,
and for the PostgreSQL tests (marked ``postgres``), which need Debian's ``postgresql`` and
psycopg (the ``postgres`` extra).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from tests._postgres_server import PostgresServer, postgres_bin_dir
from tests._redis_cluster import RedisCluster, redis_cli_binary
from tests._redis_server import RedisServer, redis_server_binary

if TYPE_CHECKING:
    import redis.asyncio


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Give each test that uses ``anyio_backend`` its backends (see the module docstring)."""
    if "anyio_backend" not in metafunc.fixturenames:
        return
    for marker in metafunc.definition.iter_markers("parametrize"):
        if "anyio_backend" in str(marker.args[0]):
            return  # pinned by the test itself
    if metafunc.definition.get_closest_marker("redis"):
        metafunc.parametrize("anyio_backend", ["asyncio"])
        return
    params: list[Any] = [pytest.param("asyncio", id="asyncio"), pytest.param("trio", id="trio")]
    if metafunc.definition.get_closest_marker("mock_clock"):
        from trio.testing import MockClock

        clock = ("trio", {"clock": MockClock(autojump_threshold=0)})
        params.append(pytest.param(clock, id="trio-mockclock"))
    metafunc.parametrize("anyio_backend", params)


@pytest.fixture
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """The async backend of this test (parametrised by :func:`pytest_generate_tests`)."""
    return request.param


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def _require_binary() -> str:
    binary = redis_server_binary()
    if binary is None:
        msg = "redis-server is not installed (apt-get install -y redis-server)"
        if _in_ci():
            pytest.fail(f"CI=true and {msg}", pytrace=False)
        pytest.skip(msg)
    return binary


def _require_cluster_binaries() -> tuple[str, str]:
    """``redis-server`` and ``redis-cli``: skip without them locally, fail with ``CI=true``
    (the same rule as :func:`_require_binary`)."""
    server = _require_binary()
    cli = redis_cli_binary()
    if cli is None:
        msg = "redis-cli is not installed (apt-get install -y redis-server)"
        if _in_ci():
            pytest.fail(f"CI=true and {msg}", pytrace=False)
        pytest.skip(msg)
    return server, cli


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One real redis-server for the whole session, on a free loopback port."""
    with RedisServer(_require_binary()) as server:
        yield server


@pytest.fixture
def private_redis_server() -> Iterator[RedisServer]:
    """A redis-server of this test's own, for tests that stop or restart it."""
    with RedisServer(_require_binary()) as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    """One real Redis Cluster (3 masters, 3 replicas) for the whole session, started on first
    use. Tests must not kill its nodes: use :func:`private_redis_cluster` for that."""
    with RedisCluster(*_require_cluster_binaries()) as cluster:
        yield cluster


@pytest.fixture
def private_redis_cluster() -> Iterator[RedisCluster]:
    """A Redis Cluster of this test's own, for tests that kill or restart nodes."""
    with RedisCluster(*_require_cluster_binaries()) as cluster:
        yield cluster


@pytest.fixture
def cluster_url(redis_cluster: RedisCluster) -> str:
    """A seed node of the session's Redis Cluster (``cluster=True`` clients find the rest)."""
    return redis_cluster.url


@pytest.fixture(params=["standalone", pytest.param("cluster", marks=pytest.mark.cluster)])
def target(request: pytest.FixtureRequest) -> tuple[str, bool]:
    """(url, cluster): the session's redis-server, or its 6-node Redis Cluster (a test that
    takes it runs on both)."""
    if request.param == "cluster":
        return request.getfixturevalue("cluster_url"), True
    return request.getfixturevalue("redis_url"), False


@pytest.fixture
def key_prefix() -> str:
    """A prefix unique to this test, so tests share the server without FLUSHDB."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    """A fresh redis-py asyncio client on the session server (asyncio tests only)."""
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


def _require_postgres() -> str:
    """PostgreSQL's binaries and psycopg: skip without them locally, fail with ``CI=true``."""
    bin_dir = postgres_bin_dir()
    msg = None
    if bin_dir is None:
        msg = "PostgreSQL is not installed (apt-get install -y postgresql)"
    else:
        try:
            import psycopg  # noqa: F401
        except ImportError:
            msg = "psycopg is not installed (pip install '.[postgres]')"
    if msg is not None:
        if _in_ci():
            pytest.fail(f"CI=true and {msg}", pytrace=False)
        pytest.skip(msg)
    assert bin_dir is not None
    return bin_dir


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One real PostgreSQL for the whole session, on a free loopback port."""
    with PostgresServer(_require_postgres()) as server:
        yield server


@pytest.fixture
def private_postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL of this test's own, for tests that restart it."""
    with PostgresServer(_require_postgres()) as server:
        yield server


@pytest.fixture
def postgres_dsn(postgres_server: PostgresServer) -> str:
    return postgres_server.dsn


@pytest.fixture
def pg_schema() -> str:
    """A schema unique to this test, so tests share the server without dropping anything."""
    return f"t{uuid.uuid4().hex[:12]}"
