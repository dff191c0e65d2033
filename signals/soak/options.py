"""Options of ``python -m signals.soak``, the backends it soaks, and the runtimes' settings.

A backend is ``memory``, ``redis``, ``cluster``, ``sqlite`` (one file in the soak's work
directory, shared by every process), ``postgres`` (the soak's own PostgreSQL, or
``--postgres-dsn``) or ``module:factory``: an import path to a callable that
takes a :class:`FactoryContext` and returns, or returns an awaitable of, either an (unentered)
pub/sub or a :class:`SoakBackend` (a pub/sub with its own ``leases=`` and ``inbox=``, however
the store is provided; a mapping with those keys works too). The soak enters each part with
``async with`` (once each, when it is an async context manager) in every worker process and in
the sender, and builds each ``SignalRuntime`` on it, as in production.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import sys
from collections.abc import Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import structlog

if TYPE_CHECKING:
    from collections.abc import Callable

    from pubsub import PubSub

__all__ = [
    "BUILTIN_BACKENDS",
    "FactoryContext",
    "SoakBackend",
    "SoakOptions",
    "WorkerConfig",
    "load_factory",
    "open_backend",
    "quiet_library_logs",
    "runtime_settings",
    "socket_timeout_s",
]

BUILTIN_BACKENDS = ("memory", "redis", "cluster", "sqlite", "postgres")
#: Deliveries before a signal is dead-lettered, in the soak: high, so that a signal whose
#: owners keep being killed is retried rather than set aside (a dead letter counts as lost).
SOAK_MAX_ATTEMPTS = 1000


@dataclass(frozen=True, slots=True)
class FactoryContext:
    """What ``python -m signals.soak`` passes to a backend factory (``--backend mod:factory``).

    * ``role``: ``"worker"`` (a worker process: a runtime with an agent) or ``"sender"`` (the
      soak process itself: a sender-only runtime, which also reads the receipts).
    * ``key_prefix``: unique to this soak run; put every key or name of your backend under it,
      so runs never see each other's data.
    * ``url``: ``--redis-url`` as given (``None`` when it was not given); a factory may use
      it for any backend address. For ``--backend sqlite`` it is the database file's path, for
      ``--backend postgres`` the DSN.
    * ``worker``: the worker's slot, ``0 .. --workers - 1`` (a replacement for a killed
      worker gets the same slot); ``None`` for the sender.
    * ``ttl_ms``: the lease TTL the runtimes use; size your client timeouts from it (at most
      a third of it, as for ``RedisStreamsPubSub(socket_timeout=)``).
    """

    role: Literal["worker", "sender"]
    key_prefix: str
    url: str | None
    worker: int | None
    ttl_ms: int


@dataclass(frozen=True, slots=True)
class SoakOptions:
    """Everything the command line sets (see ``python -m signals.soak --help``)."""

    backend: str
    redis_url: str | None
    seconds: float
    workers: int
    threads: int
    kill_every: float
    restart_redis_every: float
    blackhole_every: float
    blackhole_seconds: float
    ttl_ms: int
    rate: float
    work_ms: int
    drain_seconds: float
    seed: int
    json: bool
    keep: bool
    no_aof: bool
    block_ms: int = 0
    postgres_dsn: str | None = None

    @property
    def custom(self) -> bool:
        return self.backend not in BUILTIN_BACKENDS

    @property
    def own_redis(self) -> bool:
        """The soak starts (and may restart) its own ``redis-server``."""
        return self.backend == "redis" and self.redis_url is None

    @property
    def own_postgres(self) -> bool:
        """The soak starts (and may restart) its own PostgreSQL."""
        return self.backend == "postgres" and self.postgres_dsn is None

    @property
    def kills(self) -> bool:
        return self.backend != "memory" and self.kill_every > 0

    @property
    def restarts(self) -> bool:
        return (self.own_redis or self.own_postgres) and self.restart_redis_every > 0

    @property
    def proxied(self) -> bool:
        """Workers reach Redis through the soak's proxy (standalone Redis over plain TCP)."""
        return self.backend == "redis" and (
            self.redis_url is None or self.redis_url.startswith("redis://")
        )

    @property
    def blackholes(self) -> bool:
        return self.proxied and self.blackhole_every > 0 and self.blackhole_seconds > 0


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """What a worker process needs (passed as JSON on its command line)."""

    backend: str
    url: str | None
    key_prefix: str
    slot: int
    ttl_ms: int
    work_ms: int
    records: str
    seed: int
    block_ms: int = 0


@dataclass(frozen=True, slots=True)
class SoakBackend:
    """What a factory may return instead of a bare pub/sub: the runtime's three parts.

    ``leases`` and ``inbox`` are passed to ``SignalRuntime(leases=, inbox=)`` when given
    (``None``: the runtime finds them through the pub/sub). A part that is an async context
    manager (and not the pub/sub itself) is entered before the runtime and left after it.
    """

    pubsub: PubSub
    leases: Any = None
    inbox: Any = None

    def runtime_kwargs(self) -> dict[str, Any]:
        """``pubsub=``, and ``leases=``/``inbox=`` when given."""
        kwargs: dict[str, Any] = {"pubsub": self.pubsub}
        if self.leases is not None:
            kwargs["leases"] = self.leases
        if self.inbox is not None:
            kwargs["inbox"] = self.inbox
        return kwargs

    async def enter(self, stack: AsyncExitStack) -> None:
        """Enter every part once (the pub/sub first) on ``stack``."""
        seen: list[object] = []
        for part in (self.pubsub, self.leases, self.inbox):
            if part is None or any(part is other for other in seen):
                continue
            seen.append(part)
            if callable(getattr(part, "__aenter__", None)):
                await stack.enter_async_context(part)


def socket_timeout_s(ttl_ms: int) -> float:
    """The Redis socket timeout for a lease TTL: a third of it, at most 2 s (the library's
    advice: keep ``socket_timeout`` at most a third of the lease TTL)."""
    return max(0.05, min(2.0, ttl_ms / 3000))


def runtime_settings(ttl_ms: int) -> dict[str, Any]:
    """The ``SignalRuntime`` keyword arguments of every soak worker."""
    return {
        "lease_ttl_ms": ttl_ms,
        "recover_interval_ms": max(50, ttl_ms // 4),
        "idle_wait_ms": 100,
        "max_attempts": SOAK_MAX_ATTEMPTS,
        "shutdown_timeout_ms": 3000,
    }


def load_factory(spec: str) -> Callable[[FactoryContext], Any]:
    """The callable named by ``module:attribute`` (``attribute`` may be dotted); a
    ``ValueError`` that says what is wrong otherwise."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(
            f"--backend must be memory, redis, cluster, sqlite, postgres or module:factory, got "
            f"{spec!r}"
        )
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"--backend {spec}: cannot import {module_name!r}: {exc}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"--backend {spec}: {module_name} has no {attr!r}") from None
    if not callable(obj):
        raise ValueError(f"--backend {spec}: {attr!r} is not callable")
    return obj  # type: ignore[no-any-return]


def _is_pubsub(obj: object) -> bool:
    return not isinstance(obj, type) and all(
        callable(getattr(obj, name, None)) for name in ("publish", "subscribe", "close")
    )


async def open_backend(backend: str, ctx: FactoryContext) -> SoakBackend:
    """The parts of ``backend`` for ``ctx`` (unentered). ``redis`` and ``cluster`` build a
    ``RedisStreamsPubSub`` on ``ctx.url``, ``sqlite`` a ``SQLitePubSub`` on the file
    ``ctx.url``, ``postgres`` a ``PostgresPubSub`` on the DSN ``ctx.url`` (a schema named after
    the run); anything else is a factory's import path (see the module docstring)."""
    if backend in ("redis", "cluster"):
        from pubsub import RedisStreamsPubSub

        if ctx.url is None:
            raise ValueError(f"--backend {backend} needs a Redis URL")
        return SoakBackend(RedisStreamsPubSub(
            url=ctx.url, key_prefix=ctx.key_prefix, cluster=backend == "cluster",
            socket_timeout=socket_timeout_s(ctx.ttl_ms), block_ms=500,
        ))
    if backend == "postgres":
        from pubsub import PostgresPubSub

        if ctx.url is None:
            raise ValueError("--backend postgres needs a DSN")
        return SoakBackend(PostgresPubSub(
            ctx.url, schema=ctx.key_prefix.replace("-", "_"),
            timeout_s=max(1.0, ctx.ttl_ms / 3000),
        ))
    if backend == "sqlite":
        from pubsub import SQLitePubSub

        if ctx.url is None:
            raise ValueError("--backend sqlite needs the database file's path")
        return SoakBackend(SQLitePubSub(ctx.url))
    if backend == "memory":
        raise ValueError("the memory backend runs in one process: no pub/sub per role")
    made = load_factory(backend)(ctx)
    if inspect.isawaitable(made):
        made = await made
    if isinstance(made, Mapping):
        unknown = set(made) - {"pubsub", "leases", "inbox"}
        if unknown or "pubsub" not in made:
            raise TypeError(f"--backend {backend} returned a mapping with keys "
                            f"{sorted(made)}; expected pubsub (and leases, inbox)")
        made = SoakBackend(made["pubsub"], made.get("leases"), made.get("inbox"))
    if not isinstance(made, SoakBackend):
        made = SoakBackend(made)
    if not _is_pubsub(made.pubsub):
        raise TypeError(f"--backend {backend} returned {type(made.pubsub).__name__}, "
                        f"not a pub/sub (nor a SoakBackend)")
    return made


def quiet_library_logs() -> None:
    """Warnings and errors of the library's loggers only, on stderr (the library never
    configures logging; the soak is an application, so it does)."""
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
