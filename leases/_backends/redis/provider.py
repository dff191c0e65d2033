"""Redis lease backend: every operation is one round trip (a Lua script or one command).

Key layout: ``_signal_leases.keys.LeaseKeys``; scripts: :mod:`leases._backends.redis.lua`.
Per-key leases expire on their own (``PX``); session leases live as long as their session
key, so one ``PEXPIRE`` keeps all of them (standalone Redis only: on a Cluster a session would
cross slots, and :meth:`RedisLeaseProvider.open_lease_session` returns ``None``). Every script
touches the keys of one lease only, which share a hash tag: one slot on a Cluster. redis-py is
asyncio-only, so every call checks the running async library first.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Self, Unpack

from _signal_leases.keys import LeaseKeys
from _signal_leases.redis.script import Script, run_script
from _signal_leases.redis.support import (
    RedisHandle,
    RedisWriteOptions,
    as_int,
    map_errors,
    side_client,
    text,
)
from _signal_leases.validation import check_str
from leases._backends.redis.lua import ACQUIRE, INFO, OWNER, RELEASE, RENEW, RENEW_MANY, TRANSFER
from leases._contract import AcquireResult
from leases._info import LeaseInfo
from leases._validation import check_acquire, check_key, check_owner, check_ttl_ms

if TYPE_CHECKING:
    from types import TracebackType

    import redis.asyncio


__all__ = ["RedisLeaseProvider"]


_CHUNK = 1000  # leases per RENEW_MANY call: each call blocks the server for a few ms at most


class RedisLeaseProvider:
    """A ``LeaseProvider`` on Redis, with lease sessions and batched renewal.

    Pass exactly one of ``url`` (the provider builds the client, with ``socket_timeout`` and a
    waiting pool of ``max_connections``, and closes it in :meth:`aclose`) or ``client`` (a
    ``redis.asyncio.Redis`` or ``RedisCluster`` the caller keeps owning); ``cluster=True`` with
    ``url`` builds a ``RedisCluster``. Renewals use two connections of their own (so a busy
    pool never delays them past a deadline) when the provider built its client, or with
    ``dedicated_renewals=True`` (then call :meth:`aclose`); on a Cluster they share the
    client's per-node pools. ``key_prefix`` namespaces the keys. The client options
    (``cluster``, ``socket_timeout`` 2 s, ``max_connections`` 32, ``wait_replicas`` 0,
    ``wait_timeout_ms`` 500) are keywords shared by every Redis backend
    (``RedisWriteOptions``). Unreachable Redis raises :class:`BackendUnavailableError` (never
    read that as "the lease is free"); auth, ACL and script failures raise
    :class:`BackendPermanentError`.

    ``transfer_lease`` returns ``True`` without a new token when ``to_owner`` already holds
    the lease, so a transfer that redis-py re-sends after a timeout still reports success.

    Redis Cluster: every script touches one lease's keys, which share a hash tag (one slot).
    Lease sessions are not offered (:meth:`open_lease_session` returns ``None``: a session
    key would sit in another slot than its leases), so holders renew per key or in batches
    (:meth:`renew_leases` groups by slot and sends one pipeline per node).

    Replication. Redis acknowledges a write before its replicas have it; a master that dies
    right then loses it when a replica takes over. For leases that means a grant, a renewal
    or a fencing-counter increment the client was told about can be gone: a lease may expire
    early, two owners may each have been granted the key, and the same fencing token may be
    issued twice. ``wait_replicas=N`` (default 0: off) closes that window: every mutating call
    (acquire, renew, batched renewal, release, transfer, and the session commands) is
    followed, on the same connection of the same node, by ``WAIT N wait_timeout_ms``, and
    raises :class:`BackendUnavailableError` when fewer than ``N`` replicas acknowledged in
    time (the write may still have been applied: a repeated acquire or transfer by the same
    owner is idempotent). The cost is latency: each mutating call takes a replication round
    trip more (about one network RTT to the slowest of the ``N`` replicas; up to
    ``wait_timeout_ms`` when a replica lags), and while a master has fewer than ``N``
    replicas connected (after a failover, until the old master rejoins as a replica) its
    keys' mutating calls fail. Keep ``wait_timeout_ms`` below the client's socket timeout.
    ``WAIT`` is not a consensus protocol: with ``N`` equal to the replicas per master, the
    replica promoted after a single failure has every acknowledged write.
    """

    def __init__(
        self,
        *,
        url: str | None = None,
        client: redis.asyncio.Redis | redis.asyncio.RedisCluster | None = None,
        key_prefix: str = "leases",
        dedicated_renewals: bool | None = None,
        **options: Unpack[RedisWriteOptions],
    ) -> None:
        check_str("key_prefix", key_prefix)
        self._handle = RedisHandle("RedisLeaseProvider", url=url, client=client, **options)
        self.wait_timeout_ms = self._handle.wait_timeout_ms
        self.client: redis.asyncio.Redis = self._handle.client
        self.key_prefix = key_prefix
        self.keys = LeaseKeys(key_prefix)
        self._session_prefix = f"{key_prefix}:session:"
        client = self.client
        self._acquire: Script = Script(client, ACQUIRE)
        self._owner: Script = Script(client, OWNER)
        self._release: Script = Script(client, RELEASE)
        self._renew: Script = Script(client, RENEW)
        self._renew_many: Script = Script(client, RENEW_MANY)
        self._transfer: Script = Script(client, TRANSFER)
        self._info: Script = Script(client, INFO)
        self._renewer: Any = None  # a pool of its own for renewals, built on first use
        self._dedicated = self._handle.owns_client if dedicated_renewals is None else bool(
            dedicated_renewals
        )

    @property
    def wait_replicas(self) -> int:
        """Replicas every mutating call waits for (``WAIT``; 0: off), as constructed."""
        return self._handle.wait_replicas

    def lease_key(self, key: str) -> str:
        """The Redis key of the lease hash for ``key``."""
        return self.keys.lease(key)

    def fence_key(self, key: str) -> str:
        """The Redis key of the fencing counter for ``key``."""
        return self.keys.fence(key)

    async def _call(
        self, script: Script, operation: str, keys: list[str], *args: Any, writes: bool = True
    ) -> Any:
        return await run_script(self._handle, script, keys, [self._session_prefix, *args],
                                operation, writes=writes)

    # -- LeaseProvider ---------------------------------------------------------------------

    async def acquire_lease(
        self, key: str, owner: str, ttl_ms: int, *, session: str | None = None
    ) -> AcquireResult:
        check_acquire(key, owner, ttl_ms, session)
        keys = [self.keys.lease(key), self.keys.fence(key)]
        reply = await self._call(
            self._acquire, f"acquire of lease {key!r}", keys, owner, ttl_ms, session or ""
        )
        granted, holder, token = reply
        granted = as_int(granted)
        if granted == 1:
            return AcquireResult(True, text(holder), as_int(token))
        return AcquireResult(False, text(holder) if holder else None, None)

    async def get_lease_owner(self, key: str) -> str | None:
        check_key(key)
        reply = await self._call(
            self._owner, f"get_lease_owner of {key!r}", [self.keys.lease(key)], writes=False
        )
        return text(reply) if reply else None

    async def release_lease(self, key: str, owner: str) -> None:
        check_key(key), check_owner(owner)
        await self._call(self._release, f"release of lease {key!r}", [self.keys.lease(key)], owner)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        check_key(key), check_owner(owner), check_ttl_ms(ttl_ms)
        self._handle.require_asyncio()
        await self._handle.ready()
        self._renewal_client()
        keys, args = [self.keys.lease(key)], [self._session_prefix, owner, ttl_ms]
        with map_errors(f"renew of lease {key!r}"):
            if self.wait_replicas:
                replies = await self._handle.eval_many(
                    self._renewer, self._renew_on_renewer, [(keys, args)], f"renew of {key!r}"
                )
                reply = replies[0]
            else:
                reply = await self._renew_on_renewer(keys=keys, args=args)
        return as_int(reply) == 1

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        check_key(key), check_owner(from_owner, "from_owner")
        check_owner(to_owner, "to_owner"), check_ttl_ms(ttl_ms)
        keys = [self.keys.lease(key), self.keys.fence(key)]
        reply = await self._call(
            self._transfer, f"transfer of lease {key!r}", keys, from_owner, to_owner, ttl_ms
        )
        return as_int(reply) == 1

    # -- batched renewal -------------------------------------------------------------------

    async def renew_leases(self, items: Sequence[tuple[str, str]], ttl_ms: int) -> set[str]:
        """Renew many ``(key, owner)`` leases for ``ttl_ms``; returns the keys still held.

        Standalone Redis: one ``RENEW_MANY`` script per 1,000 leases, all in one pipeline
        (one round trip). Redis Cluster: the leases are grouped by hash slot (a script may only
        touch one slot), one ``RENEW_MANY`` per slot (per 1,000 leases of a slot), and the
        scripts of all the slots a node serves go to that node in one pipeline: one round trip
        per master, the masters in parallel. So K leases spread over S slots cost S EVALSHA
        commands (about K while K is much smaller than 16,384) but only one round trip per
        node. With ``wait_replicas`` each node's pipeline ends with one ``WAIT``. A node that
        lost the script (restart, failover) gets ``SCRIPT LOAD`` and a second round trip."""
        check_ttl_ms(ttl_ms)
        items = [(check_key(k), check_owner(o)) for k, o in items]
        if not items:
            return set()
        self._handle.require_asyncio()
        await self._handle.ready()
        chunks = self._chunks(items)
        kept: set[str] = set()
        client = self._renewal_client()
        operation = f"renewal of {len(items)} leases"
        calls = [
            (
                [self.keys.lease(k) for k, _ in chunk],
                [self._session_prefix, ttl_ms, *(o for _, o in chunk)],
            )
            for chunk in chunks
        ]
        with map_errors(operation):
            replies = await self._handle.eval_many(
                client, self._renew_many_on_renewer, calls, operation
            )
        for chunk, reply in zip(chunks, replies, strict=True):
            kept.update(chunk[as_int(i) - 1][0] for i in reply)
        return kept

    def _chunks(self, items: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
        if not self._handle.cluster:
            return [items[i : i + _CHUNK] for i in range(0, len(items), _CHUNK)]
        from redis.crc import key_slot

        by_slot: dict[int, list[tuple[str, str]]] = {}
        for key, owner in items:
            by_slot.setdefault(key_slot(self.keys.lease(key).encode()), []).append((key, owner))
        return [
            group[i : i + _CHUNK]
            for group in by_slot.values()
            for i in range(0, len(group), _CHUNK)
        ]

    # -- lease sessions --------------------------------------------------------------------

    async def open_lease_session(self, ttl_ms: int) -> str | None:
        """Open a session alive for ``ttl_ms``; ``None`` on a Redis Cluster (no sessions)."""
        check_ttl_ms(ttl_ms)
        if self._handle.cluster:
            return None
        self._handle.require_asyncio()
        session = uuid.uuid4().hex
        key = self.keys.session(session)
        with map_errors("open of a lease session"):
            if self.wait_replicas:
                await self._checked(
                    self.client, [(key, "SET", key, "1", "PX", ttl_ms, "NX")], "open of a session"
                )
            else:
                await self.client.set(key, "1", px=ttl_ms, nx=True)
        return session

    async def renew_lease_session(self, session: str, ttl_ms: int) -> bool:
        """Keep ``session`` (and every lease in it) alive for ``ttl_ms`` more; ``False`` when it
        has expired (its leases are free; open a new one)."""
        check_owner(session, "session"), check_ttl_ms(ttl_ms)
        self._handle.require_asyncio()
        key = self.keys.session(session)
        with map_errors("renewal of a lease session"):
            if self.wait_replicas:
                replies = await self._checked(
                    self._renewal_client(), [(key, "PEXPIRE", key, ttl_ms)], "session renewal"
                )
                return bool(replies[0])
            return bool(await self._renewal_client().pexpire(key, ttl_ms))

    async def close_lease_session(self, session: str) -> None:
        """End ``session``: every lease in it is free at once."""
        check_owner(session, "session")
        self._handle.require_asyncio()
        key = self.keys.session(session)
        with map_errors("close of a lease session"):
            if self.wait_replicas:
                await self._checked(self.client, [(key, "DEL", key)], "close of a session")
            else:
                await self.client.delete(key)

    async def _checked(
        self, client: Any, commands: Sequence[tuple[Any, ...]], operation: str
    ) -> list[Any]:
        replies = await self._handle.pipeline(client, commands, operation)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    # -- inspection and lifecycle ----------------------------------------------------------

    async def lease_info(self, key: str) -> LeaseInfo | None:
        """Owner, remaining TTL (``None`` if the key has no expiry) and token, or ``None``."""
        check_key(key)
        reply = await self._call(
            self._info, f"lease_info of {key!r}", [self.keys.lease(key)], writes=False
        )
        if not reply:
            return None
        owner, token, pttl = reply[0], reply[1], reply[2]
        remaining = as_int(pttl)
        return LeaseInfo(
            key=key,
            owner=text(owner),
            ttl_ms_remaining=remaining if remaining >= 0 else None,
            token=as_int(token) if token else None,
        )

    def _renewal_client(self) -> Any:
        """Renewals go over connections of their own: a busy main pool (thousands of runs
        reading and acknowledging) must never delay them past a lease's deadline."""
        if self._renewer is None:
            self._renewer = (
                side_client(self.client, name=f"{self.key_prefix}:renewals")
                if self._dedicated else self.client
            )
            self._renew_many_on_renewer = Script(self._renewer, RENEW_MANY)
            self._renew_on_renewer = Script(self._renewer, RENEW)
        return self._renewer

    async def aclose(self) -> None:
        """Close the client if this provider built it (from ``url``), and the renewal pool."""
        renewer, self._renewer = self._renewer, None
        if renewer is not None and renewer is not self.client:
            await renewer.aclose()
        await self._handle.aclose()

    async def __aenter__(self) -> Self:
        self._handle.require_asyncio()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
