"""Redis plumbing for every layer: the client owner, the error mapper, reply decoders.

:class:`RedisHandle` is the one "url or client" constructor of the library: given ``url`` it
builds (and later closes) a client with bounded timeouts, few retries and a *blocking*
connection pool (exhausting it waits instead of failing); given ``client`` it uses the
caller's client and never closes it. :func:`map_errors` turns redis-py exceptions into the
library's error tree, telling transient failures from permanent ones.

It is one module of a little over 400 lines on purpose: the client owner, its WAIT logic and
the error mapper are the one place every Redis backend goes through, and splitting them would
scatter the rules of a single round trip over several files.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypedDict

import redis.asyncio
import redis.exceptions as rex
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff, NoBackoff

from _signal_leases.errors import BackendPermanentError, BackendUnavailableError
from _signal_leases.redis.pools import (
    DEFAULT_MAX_CONNECTIONS,
    WaitingConnectionPool,
    WaitingRedisCluster,
    quick_writes,
)
from _signal_leases.running import require_asyncio
from _signal_leases.validation import check_int, check_seconds, check_str

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_SOCKET_TIMEOUT_S",
    "DEFAULT_WAIT_TIMEOUT_MS",
    "UNAVAILABLE",
    "RedisClientOptions",
    "RedisHandle",
    "RedisWriteOptions",
    "WaitingRedisCluster",
    "as_int",
    "atomic_pipeline",
    "is_cluster",
    "is_permanent",
    "map_errors",
    "node_reader_client",
    "reader_client",
    "refresh_slots",
    "side_client",
    "stream_id",
    "text",
]

#: Socket read and connect timeout of clients built from a URL, in seconds.
DEFAULT_SOCKET_TIMEOUT_S = 2.0
#: WAIT's timeout with ``wait_replicas`` > 0, in ms (below the socket timeout).
DEFAULT_WAIT_TIMEOUT_MS = 500


class RedisClientOptions(TypedDict, total=False):
    """The client options every Redis backend takes as keywords (``**options``), checked and
    applied by :class:`RedisHandle`, which holds their defaults: ``cluster`` (build a
    ``RedisCluster`` from ``url``), ``socket_timeout`` (connect and read timeout of a client
    built from ``url``, default 2 s) and ``max_connections`` (its pool, default 32)."""

    cluster: bool
    socket_timeout: float
    max_connections: int


class RedisWriteOptions(RedisClientOptions, total=False):
    """:class:`RedisClientOptions` plus ``wait_replicas`` (``WAIT`` for that many replicas
    after every write, default 0: off) and ``wait_timeout_ms`` (default 500)."""

    wait_replicas: int
    wait_timeout_ms: int

#: Errors that mean "not reachable now": the call may work later.
UNAVAILABLE: tuple[type[Exception], ...] = (
    rex.ConnectionError,
    rex.TimeoutError,
    rex.BusyLoadingError,
    rex.ReadOnlyError,
    rex.TryAgainError,
    rex.ClusterDownError,
    rex.AskError,  # and MovedError: the slot moved (failover, resharding) under this call
    rex.SlotNotCoveredError,  # a Cluster client whose slot map has a hole just now
    rex.OutOfMemoryError,
    OSError,
)

_PERMANENT: tuple[type[Exception], ...] = (
    rex.AuthenticationError,
    rex.AuthorizationError,
    rex.AuthenticationWrongNumberOfArgsError,
    rex.NoPermissionError,
)


def is_permanent(exc: BaseException) -> bool:
    """True for a failure that retrying cannot fix (auth, ACL, wrong database, script error,
    a command whose keys cross Cluster slots)."""
    if isinstance(exc, _PERMANENT):
        return True
    if isinstance(exc, rex.RedisClusterException):  # not a RedisError: redis-py's own checks
        return not isinstance(exc, UNAVAILABLE) and not _cluster_unreachable(exc)
    if isinstance(exc, rex.ConnectionError) and "Invalid Database" in str(exc):
        return True
    # WRONGTYPE, script errors, "DB index is out of range", ...
    return (isinstance(exc, rex.ResponseError) and not isinstance(exc, UNAVAILABLE)
            and not _topology_changing(exc))


def _topology_changing(exc: BaseException) -> bool:
    """A node answered as a replica (``WAIT`` sent to a master demoted by a failover, before
    the client saw the new topology): the next attempt reaches the new master."""
    return isinstance(exc, rex.ResponseError) and (
        "cannot be used with replica instances" in str(exc) or str(exc).startswith("READONLY")
    )


def _cluster_unreachable(exc: BaseException) -> bool:
    """redis-py found no node of the Cluster to talk to (all down, or mid-failover)."""
    return isinstance(exc, rex.RedisClusterException) and "cannot be connected" in str(exc)


@contextmanager
def map_errors(operation: str) -> Iterator[None]:
    """Run a Redis call; raise :class:`BackendPermanentError` or :class:`BackendUnavailableError`
    (naming ``operation``) for redis-py's errors. Other exceptions pass unchanged."""
    try:
        yield
    except (BackendUnavailableError, BackendPermanentError):
        raise
    except (rex.RedisError, rex.RedisClusterException, OSError) as exc:
        if is_permanent(exc):
            raise BackendPermanentError(f"Redis refused {operation}: {exc}") from exc
        if isinstance(exc, UNAVAILABLE) or _cluster_unreachable(exc) or _topology_changing(exc):
            raise BackendUnavailableError(f"Redis unavailable during {operation}: {exc}") from exc
        raise
    except (AttributeError, TypeError) as exc:
        if _torn_down_under_redis_py(exc):
            raise BackendUnavailableError(
                f"Redis unavailable during {operation}: a connection was closed while in use "
                f"({type(exc).__name__}: {exc})"
            ) from exc
        raise


_REDIS_DIR = os.path.dirname(redis.__file__) + os.sep


def _torn_down_under_redis_py(exc: BaseException) -> bool:
    """An ``AttributeError``/``TypeError`` raised in redis-py's own last frames: a connection
    closed by another task while this one used it, as when a Cluster client rebuilds its
    topology during a failover (``'NoneType' object has no attribute 'writelines'``; redis-py
    issues #3546 and #3835). That is an outage of the node, not a bug of the caller."""
    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    return any(frame.filename.startswith(_REDIS_DIR) for frame in frames)


def text(value: object) -> str:
    """A reply value as ``str`` (clients with and without ``decode_responses``)."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def as_int(value: object) -> int:
    """A reply value as ``int``."""
    if isinstance(value, bytes | str):
        return int(value)
    if isinstance(value, int):
        return value
    raise TypeError(f"unexpected integer reply from Redis: {value!r}")


def stream_id(value: object) -> tuple[int, int]:
    """``"1700000000000-3"`` -> ``(1700000000000, 3)``, for ordering entry ids."""
    ms, _, seq = text(value).partition("-")
    return int(ms), int(seq or 0)


class RedisHandle:
    """Who owns the Redis client: built here from ``url`` (and closed by :meth:`aclose`), or
    the caller's ``client`` (never closed here). Give exactly one.

    A client built from ``url`` gets ``socket_timeout`` as both its connect and read timeout,
    at most one retry, and ``max_connections`` pooled connections that callers *wait* for (a
    busy pool is latency, never an error). ``cluster=True`` builds a
    ``redis.asyncio.RedisCluster`` instead (a :class:`WaitingRedisCluster`: at most
    ``max_connections`` commands at once, the others wait; pools per node). Call
    :meth:`ready` before the first command on a Cluster.

    ``wait_replicas=N`` (0: off) makes :meth:`eval_many` and :meth:`pipeline` end each node's
    commands with ``WAIT N wait_timeout_ms`` on the same connection, and raise
    :class:`BackendUnavailableError` when fewer than ``N`` replicas acknowledged in time.
    """

    def __init__(
        self,
        what: str,
        *,
        url: str | None = None,
        client: Any = None,
        writes: bool = True,
        **options: Any,
    ) -> None:
        # The options of RedisWriteOptions, or of RedisClientOptions when the backend has no
        # WAIT behaviour (writes=False): anything else is the caller's typo, named as theirs.
        allowed = (RedisWriteOptions if writes else RedisClientOptions).__optional_keys__
        for name in options:
            if name not in allowed:
                raise TypeError(f"{what}() got an unexpected keyword argument {name!r}")
        cluster = options.get("cluster", False)
        socket_timeout = options.get("socket_timeout", DEFAULT_SOCKET_TIMEOUT_S)
        max_connections = options.get("max_connections", DEFAULT_MAX_CONNECTIONS)
        wait_replicas = options.get("wait_replicas", 0)
        wait_timeout_ms = options.get("wait_timeout_ms", DEFAULT_WAIT_TIMEOUT_MS)
        if (url is None) == (client is None):
            raise TypeError(f"{what} needs exactly one of url= or client=")
        self.what = what
        self.socket_timeout = check_seconds("socket_timeout", socket_timeout, positive=True)
        self.max_connections = check_int("max_connections", max_connections)
        self.wait_replicas = check_int("wait_replicas", wait_replicas, minimum=0)
        self.wait_timeout_ms = check_int("wait_timeout_ms", wait_timeout_ms)
        if not isinstance(cluster, bool):
            raise TypeError(f"cluster must be a bool, got {type(cluster).__name__}")
        if url is not None:
            check_str("url", url)
            self.owns_client = True
            self.client = self._from_url(url, cluster)
        else:
            if not isinstance(client, redis.asyncio.Redis | redis.asyncio.RedisCluster):
                raise TypeError(
                    f"client must be a redis.asyncio.Redis or RedisCluster, got "
                    f"{type(client).__name__}"
                )
            self.owns_client = False
            self.client = client
        self.cluster = isinstance(self.client, redis.asyncio.RedisCluster)
        self.initialized = not self.cluster  # see ready()

    def _from_url(self, url: str, cluster: bool) -> Any:
        common: dict[str, Any] = {
            "socket_timeout": self.socket_timeout,
            "socket_connect_timeout": self.socket_timeout,
            "retry": Retry(ExponentialBackoff(cap=0.2, base=0.02), 1),
            "health_check_interval": 30,
        }
        try:
            if cluster:
                return WaitingRedisCluster.from_url(
                    url, command_slots=self.max_connections, **common
                )
            pool = WaitingConnectionPool.from_url(
                url, max_connections=self.max_connections, timeout=self.socket_timeout * 5,
                **common,
            )
        except ValueError as exc:
            raise ValueError(f"url is not a valid Redis URL ({url!r}): {exc}") from None
        pool.connection_class = quick_writes(pool.connection_class)  # (TCP, TLS or Unix)
        return redis.asyncio.Redis.from_pool(pool)

    def require_asyncio(self) -> None:
        """Raise ``UnsupportedBackendError`` unless running on asyncio."""
        require_asyncio(self.what)

    async def ready(self) -> None:
        """Let a Cluster client learn the slot map before its first command (a no-op after
        that, and for standalone clients). redis-py 8 picks the node of a command sent
        before the client has initialised without looking at its keys, so many commands
        sent at once by a fresh client go to wrong nodes; the ``MOVED`` replies then make
        it close every connection, including those other commands are using."""
        if not self.initialized:
            with map_errors(f"{self.what}: connect to the cluster"):
                await self.client.initialize()
            self.initialized = True

    async def aclose(self) -> None:
        """Close the client if it was built here."""
        if self.owns_client:
            await self.client.aclose()

    async def eval_many(
        self,
        client: Any,
        script: Any,
        calls: Sequence[tuple[Sequence[str], Sequence[Any]]],
        operation: str,
    ) -> list[Any]:
        """Run ``script`` (a :class:`~_signal_leases.redis.script.Script`) once per (keys,
        args) in ``calls``: one pipeline, so one round trip per node, each node's EVALSHAs
        followed by WAIT when ``wait_replicas`` is set. A node that lacks the script (a
        restart, a failover) gets SCRIPT LOAD and its calls again. Raises the first error
        reply."""
        commands = [
            (keys[0], "EVALSHA", script.sha, len(keys), *keys, *args) for keys, args in calls
        ]
        replies = await self.pipeline(client, commands, operation)
        missing = [i for i, r in enumerate(replies) if isinstance(r, rex.NoScriptError)]
        if missing:
            await client.script_load(script.script)  # on a Cluster: every primary
            again = await self.pipeline(client, [commands[i] for i in missing], operation)
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    async def pipeline(
        self, client: Any, commands: Sequence[tuple[Any, ...]], operation: str
    ) -> list[Any]:
        """Send ``commands`` (each ``(routing key, *command)``) in one pipeline; with
        ``wait_replicas``, end each node's part with WAIT and check every node's count.

        Returns the replies of ``commands`` (exceptions in place). On a Cluster, a command
        redirected to another node (``MOVED`` during a failover or resharding) is not covered
        by that node's WAIT: then the call raises :class:`BackendUnavailableError`."""
        wait, cluster = self.wait_replicas, self.cluster
        nodes: dict[str, Any] = {}
        async with client.pipeline(transaction=False) as pipe:
            for routing_key, *command in commands:
                pipe.execute_command(*command)
                if wait and cluster:
                    node = client.get_node_from_key(routing_key)
                    nodes[node.name] = node
            if wait:
                if cluster:
                    for node in nodes.values():
                        pipe.execute_command("WAIT", wait, self.wait_timeout_ms, target_nodes=node)
                else:
                    pipe.execute_command("WAIT", wait, self.wait_timeout_ms)
            results = await pipe.execute(raise_on_error=False)
        replies = list(results[: len(commands)])
        if any(isinstance(r, rex.NoScriptError) for r in replies):
            return replies  # eval_many sends those again, with a WAIT that covers the rest
        for acked in results[len(commands) :]:
            if isinstance(acked, Exception):
                raise acked
            if as_int(acked) < wait:
                raise BackendUnavailableError(
                    f"Redis did not replicate {operation} to {wait} replica(s) within "
                    f"{self.wait_timeout_ms} ms (only {as_int(acked)} acknowledged)"
                )
        if wait and cluster:
            moved = {client.get_node_from_key(c[0]).name for c in commands} - set(nodes)
            if moved:
                raise BackendUnavailableError(
                    f"{operation}: slots moved to {sorted(moved)} meanwhile (not confirmed "
                    f"by WAIT)"
                )
        return replies


def side_client(client: Any, *, name: str, connections: int = 2) -> Any:
    """A client with ``client``'s connection settings but a small pool of its own, for calls
    that must never queue behind the main pool (lease renewals). On a Cluster: ``client``."""
    if isinstance(client, redis.asyncio.RedisCluster):
        return client
    pool = client.connection_pool
    kwargs = dict(pool.connection_kwargs)
    kwargs["client_name"] = name
    side = redis.asyncio.BlockingConnectionPool(
        connection_class=pool.connection_class, max_connections=connections, **kwargs
    )
    return redis.asyncio.Redis.from_pool(side)


def is_cluster(client: object) -> bool:
    """Whether ``client`` is a ``redis.asyncio.RedisCluster``."""
    return isinstance(client, redis.asyncio.RedisCluster)


def atomic_pipeline(client: Any) -> Any:
    """A MULTI/EXEC pipeline for commands on one key (or one slot).

    On a Cluster it is a cluster transaction where redis-py offers one (the commands' keys
    must share a slot). Older redis-py refuses transactions on a Cluster: then it is a plain
    pipeline: the commands still reach their one node in order over one connection, only
    not atomically."""
    try:
        return client.pipeline(transaction=True)
    except rex.RedisClusterException:
        return client.pipeline(transaction=False)


def _blocking_reader(
    connection_class: Any, kwargs: dict[str, Any], *, block_ms: int, name: str
) -> redis.asyncio.Redis:
    kwargs = dict(kwargs)
    kwargs["socket_timeout"] = block_ms / 1000 + 5
    kwargs["retry"] = Retry(NoBackoff(), 0)
    kwargs.pop("retry_on_timeout", None)
    kwargs.pop("retry_on_error", None)
    kwargs["client_name"] = name
    reader_pool = redis.asyncio.ConnectionPool(
        connection_class=connection_class, max_connections=2, **kwargs
    )
    return redis.asyncio.Redis.from_pool(reader_pool)


def reader_client(client: redis.asyncio.Redis, *, block_ms: int, name: str) -> redis.asyncio.Redis:
    """A client for blocking reads on its own connection, with ``client``'s connection settings
    but a socket timeout above ``block_ms`` and no retries (a retried blocking XREADGROUP can
    hand entries to a connection that is then dropped)."""
    pool = client.connection_pool
    return _blocking_reader(
        pool.connection_class, pool.connection_kwargs, block_ms=block_ms, name=name
    )


def node_reader_client(node: Any, *, block_ms: int, name: str) -> redis.asyncio.Redis:
    """:func:`reader_client` for one node of a Cluster (a ``ClusterNode``): a plain client
    to that node only, with the cluster client's connection settings. It follows no
    redirection: a command for a key the node does not serve raises ``MovedError``."""
    return _blocking_reader(
        node.connection_class, node.connection_kwargs, block_ms=block_ms, name=name
    )


async def refresh_slots(client: Any) -> None:
    """Make a Cluster client fetch the slot map again now (after a failover or a
    resharding its cached map sends commands to a dead or wrong node until it notices)."""
    if is_cluster(client):
        with map_errors("refresh of the cluster's slot map"):
            await client.nodes_manager.initialize()
