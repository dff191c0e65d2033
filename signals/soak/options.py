"""Options of ``python -m signals.soak``, the backends it soaks, and the runtimes' settings.

A backend is ``memory``, ``redis``, ``cluster`` or ``module:factory``: an import path to a
callable that takes a :class:`FactoryContext` and returns an (unentered) pub/sub, or an
awaitable of one. The soak enters it with ``async with`` in every worker process and in the
sender, and builds each ``SignalRuntime`` on it (so the runtime finds its lease provider and
store through the pub/sub, as in production).
"""

from __future__ import annotations

import importlib
import inspect
import logging
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import structlog

if TYPE_CHECKING:
    from collections.abc import Callable

    from pubsub import PubSub

__all__ = [
    "BUILTIN_BACKENDS",
    "FactoryContext",
    "SoakOptions",
    "WorkerConfig",
    "load_factory",
    "open_pubsub",
    "quiet_library_logs",
    "runtime_settings",
    "socket_timeout_s",
]

BUILTIN_BACKENDS = ("memory", "redis", "cluster")
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
      it for any backend address.
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

    @property
    def custom(self) -> bool:
        return self.backend not in BUILTIN_BACKENDS

    @property
    def own_redis(self) -> bool:
        """The soak starts (and may restart) its own ``redis-server``."""
        return self.backend == "redis" and self.redis_url is None

    @property
    def kills(self) -> bool:
        return self.backend != "memory" and self.kill_every > 0

    @property
    def restarts(self) -> bool:
        return self.own_redis and self.restart_redis_every > 0

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
            f"--backend must be memory, redis, cluster or module:factory, got {spec!r}"
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


async def open_pubsub(backend: str, ctx: FactoryContext) -> PubSub:
    """The pub/sub of ``backend`` for ``ctx`` (unentered). ``redis`` and ``cluster`` build a
    ``RedisStreamsPubSub`` on ``ctx.url``; anything else is a factory's import path."""
    if backend in ("redis", "cluster"):
        from pubsub import RedisStreamsPubSub

        if ctx.url is None:
            raise ValueError(f"--backend {backend} needs a Redis URL")
        return RedisStreamsPubSub(
            url=ctx.url, key_prefix=ctx.key_prefix, cluster=backend == "cluster",
            socket_timeout=socket_timeout_s(ctx.ttl_ms), block_ms=500,
        )
    if backend == "memory":
        raise ValueError("the memory backend runs in one process: no pub/sub per role")
    made = load_factory(backend)(ctx)
    if inspect.isawaitable(made):
        made = await made
    if not all(callable(getattr(made, name, None)) for name in ("publish", "subscribe", "close")):
        raise TypeError(f"--backend {backend} returned {type(made).__name__}, not a pub/sub")
    return made  # type: ignore[no-any-return]


def quiet_library_logs() -> None:
    """Warnings and errors of the library's loggers only, on stderr (the library never
    configures logging; the soak is an application, so it does)."""
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
