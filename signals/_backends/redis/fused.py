"""The fused calls of the Redis core (route, claim, release, abort): the inbox step and the
lease step in one script, reading and granting the leases of the ``RedisLeaseProvider`` the
store was built with. A mixin of :class:`~signals.RedisSignalStore`."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from _signal_leases.redis.support import as_int, text
from signals._backends.redis.inbox import RedisInbox
from signals.kit._capabilities import CARRY_LIMIT, Claim, Claimed, Routed
from signals.kit._core import NO_LIMITS, Limits

if TYPE_CHECKING:
    from leases import LeaseProvider
    from signals._model import EntryMode, Signal

__all__ = ["RedisFused"]


class RedisFused(RedisInbox):
    """See the module docstring."""

    leases: LeaseProvider | None = None

    async def track_threads(self, runtime_id: str, *, add: Sequence[str] = (),
                            remove: Sequence[str] = ()) -> None:
        raise NotImplementedError

    def fuses_with(self, leases: LeaseProvider) -> bool:
        """True for the lease provider this store was built with (same Redis, same keys)."""
        return self.leases is not None and leases is self.leases

    async def route(
        self, thread_key: str, signal: Signal, mode: EntryMode, *, claim: Claim | None,
        sender: str | None, wake_workers: bool, limits: Limits = NO_LIMITS,
        interrupt: bool = False,
    ) -> Routed:
        if claim is not None and self._idx == "0":  # Cluster: track before we can own it
            await self.track_threads(claim.runtime_id, add=[thread_key])
        args = [
            *self._accept_args(signal, mode, limits), "1",
            claim.owner if claim else "", claim.ttl_ms if claim else 0,
            (claim.session or "") if claim else "", sender or "", self.keys.notice_prefix,
            self.keys.work_channel, "1" if wake_workers else "0", CARRY_LIMIT,
        ]
        if interrupt:
            args.append("1")  # ARGV[31], only then: every argument costs its packing
        reply = await self._run("accept", thread_key, args, f"send to thread {thread_key!r}",
                                runtime_id=claim.runtime_id if claim else None)
        accepted, (owner, claimed, token, carried, *heard) = self._accepted(signal, reply)
        heard_by = heard[0] if heard and self._idx == "1" else None  # (a Cluster: one node's)
        workers = None if heard_by is None else as_int(heard_by)
        routed = Routed(accepted, text(owner) if owner else None, as_int(claimed) == 1,
                        as_int(token) if token else None, as_int(carried) == 1, workers)
        if self._idx == "0":
            await self._redo_index(thread_key, routed, wake_workers)
        return routed

    async def _redo_index(self, thread_key: str, routed: Routed, wake_workers: bool) -> None:
        """Cluster: a pending duplicate indexes its thread again (its first sender may have
        died between the inbox write and the index write); a work notice goes out after the
        index write."""
        accepted = routed.accepted
        receipt = accepted.receipt
        if accepted.outcome == "duplicate" and receipt is not None and \
                receipt.status in ("pending", "scheduled") and routed.owner is None:
            await self._apply_index(thread_key, "a", time.time() * 1000)

    async def claim(self, thread_key: str, claim: Claim) -> Claimed:
        if self._idx == "0":
            await self.track_threads(claim.runtime_id, add=[thread_key])
        args = [claim.owner, claim.ttl_ms, claim.session or "", self.keys.notice_prefix]
        code, owner, token, left = await self._run(
            "claim", thread_key, args, f"claim of thread {thread_key!r}",
            runtime_id=claim.runtime_id,
        )
        code = as_int(code)
        if code == 1:
            return Claimed(claimed=True, owner=claim.owner, token=as_int(token))
        if self._idx == "0":
            await self.track_threads(claim.runtime_id, remove=[thread_key])
        if code == 0:
            return Claimed(owner=text(owner))
        due = float(text(left)) / 1000 if code == 2 and as_int(left) else None
        return Claimed(empty=code == 2, next_due=due)

    async def release_if_idle(self, thread_key: str, owner: str, runtime_id: str) -> bool:
        [released] = await self._run("release", thread_key, [owner],
                                     f"release of thread {thread_key!r}", runtime_id=runtime_id)
        if as_int(released) == 1 and self._idx == "0":
            await self.track_threads(runtime_id, remove=[thread_key])
        return as_int(released) == 1

    async def abort(
        self, thread_key: str, run_id: str | None, *, reason: str, clear: bool
    ) -> str | None:
        """Abort ``run_id`` (default: the live owner) if it holds the thread; see the
        capability. Returns the aborted run id or ``None``."""
        args = [run_id or "", reason, "1" if clear else "0", self.keys.notice_prefix]
        [run] = await self._run("abort", thread_key, args, f"abort on thread {thread_key!r}")
        return text(run) if run else None
