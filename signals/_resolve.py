"""How a ``SignalRuntime`` checks its arguments and finds its store and lease provider."""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any

from _signal_leases.errors import ConfigurationError
from _signal_leases.keys import pubsub_layout
from leases import (
    LeaseProvider,
    NoopLeaseProvider,
    is_lease_provider,
    resolve_lease_provider,
)
from signals.kit._core import CORE_METHODS, SignalCore, is_signal_core

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "check_agent",
    "check_pubsub",
    "check_store",
    "resolve_core",
    "resolve_leases",
]


def _describe(obj: object) -> str:
    if isinstance(obj, type):
        return f"the class {obj.__qualname__} (pass an instance: {obj.__qualname__}(...))"
    return f"{type(obj).__name__} {obj!r:.60}"


def check_pubsub(pubsub: object) -> None:
    """``TypeError`` unless ``pubsub`` is a pub/sub instance (structurally)."""
    if isinstance(pubsub, type) or not all(
        callable(getattr(pubsub, name, None)) for name in ("publish", "subscribe", "close")
    ):
        hint = " (build RedisStreamsPubSub(url=...) for a URL)" if isinstance(pubsub, str) else ""
        raise TypeError(
            f"pubsub must be a PubSub instance such as InMemoryPubSub() or "
            f"RedisStreamsPubSub(url=...), got {_describe(pubsub)}{hint}"
        )


def _is_async_callable(obj: Any) -> bool:
    while isinstance(obj, functools.partial):
        obj = obj.func
    if inspect.iscoroutinefunction(obj):
        return True
    call = getattr(obj, "__call__", None)  # noqa: B004  (an object with an async __call__)
    return not inspect.isfunction(obj) and inspect.iscoroutinefunction(call)


def check_agent(agent: object) -> None:
    """``TypeError`` unless ``agent`` is ``None`` (sender only) or an ``async def``."""
    if agent is None:
        return
    if isinstance(agent, type) or not _is_async_callable(agent):
        raise TypeError(
            f"agent must be an async function taking a Run (`async def agent(run): ...`) or "
            f"None for a sender-only runtime, got {_describe(agent)}"
        )


def resolve_leases(pubsub: object, leases: object) -> LeaseProvider:
    """The given ``leases`` (checked structurally) or the pub/sub's provider, else no-op."""
    if leases is None:
        return resolve_lease_provider(pubsub)
    if isinstance(leases, type) or not is_lease_provider(leases):
        raise TypeError(
            f"leases must be a LeaseProvider (acquire_lease, get_lease_owner, release_lease, "
            f"renew_lease, transfer_lease), got {_describe(leases)}"
        )
    return leases  # type: ignore[return-value]


def _shared(pubsub: object, name: str, factory: Callable[[], SignalCore]) -> SignalCore:
    """One store per pub/sub instance (and lease provider), when the pub/sub can hold it."""
    extension = getattr(pubsub, "extension", None)
    if callable(extension):
        return extension(name, factory)  # type: ignore[no-any-return]
    return factory()


def resolve_core(pubsub: object, leases: LeaseProvider) -> SignalCore:
    """The core the runtime uses when ``inbox=`` is not given.

    In order: the pub/sub itself when it is a :class:`~signals.kit.SignalCore` (the twelve
    methods); its ``signal_core()`` when it has one (a hook a backend's pub/sub offers); a
    :class:`~signals.RedisSignalStore` on the pub/sub's Redis connection
    (``RedisStreamsPubSub``); an in-memory store when the leases are process-local. One core
    is shared by every runtime built on the same pub/sub (so a sender-only runtime and a worker
    in one process see the same inboxes). Anything else would lose signals across processes:
    :class:`ConfigurationError`.
    """
    if is_signal_core(pubsub):
        return pubsub  # type: ignore[return-value]
    hook = getattr(pubsub, "signal_core", None)
    if callable(hook):
        return _shared(pubsub, f"signals.core:{id(leases)}", lambda: check_store(hook(leases)))
    database = getattr(pubsub, "sql_database", None)
    if database is not None:  # SQLitePubSub, PostgresPubSub: the SQL core in the same database
        from signals.kit._sql import SQLCore

        own = getattr(pubsub, "get_lease_provider", lambda: None)()
        fused = leases if leases is own else None
        return _shared(pubsub, f"signals.core:{id(fused)}", lambda: SQLCore(
            database, leases=fused, pubsub=pubsub))  # type: ignore[arg-type]
    client = getattr(pubsub, "redis_client", None)
    if client is not None:
        from signals._backends.redis.store import RedisSignalStore

        prefix = getattr(pubsub, "key_prefix", "pubsub")
        own = getattr(pubsub, "get_lease_provider", lambda: None)()
        fused = leases if leases is own else None
        return _shared(
            pubsub, f"signals.store:{id(fused)}",
            lambda: RedisSignalStore(client=client, key_prefix=pubsub_layout(prefix)[0],
                                     leases=fused),
        )
    from leases import InMemoryLeaseProvider  # here: a Redis sender never imports it

    if isinstance(leases, NoopLeaseProvider | InMemoryLeaseProvider):
        from signals._backends.memory.store import InMemorySignalStore

        memory = leases if isinstance(leases, InMemoryLeaseProvider) else None
        return _shared(
            pubsub, f"signals.store:{id(memory)}", lambda: InMemorySignalStore(leases=memory)
        )
    raise ConfigurationError(
        f"the lease provider is shared across processes but {type(pubsub).__name__} gives no "
        f"durable signal core: pass inbox=<a signals.kit.SignalCore> (the twelve methods of "
        f"docs/custom-backend.md, or signals.kit.SQLCore over your database), or give the "
        f"pub/sub a signal_core(leases) method that returns one"
    )


def check_store(store: object) -> SignalCore:
    """``TypeError`` unless ``store`` is structurally a :class:`~signals.kit.SignalCore`."""
    if not is_signal_core(store):
        missing = [m for m in CORE_METHODS if not callable(getattr(store, m, None))]
        raise TypeError(
            f"inbox must be a signals.kit.SignalCore, got {_describe(store)} (missing: "
            f"{', '.join(missing) if missing else 'it is a class, not an instance'})"
        )
    return store  # type: ignore[return-value]
