"""``HeldLease`` (a lease a heartbeat keeps alive, with its guards) and the safety margin."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import anyio

__all__ = ["HeldLease", "LeaseBook", "safety_margin_ms"]


def safety_margin_ms(ttl_ms: int) -> float:
    """How long before the server-side expiry a lease is given up locally, in ms.

    ``2 ms + 1 %`` of the TTL (a 1 % clock-rate drift plus scheduling slack), capped at half
    the TTL so very short leases still leave the body some time.
    """
    return min(2.0 + ttl_ms / 100, ttl_ms / 2)


class LeaseBook:
    """The leases one :class:`~leases.LeaseHeartbeat` holds, by key, and the local deadline
    of its session (``-inf`` without one): the state a :class:`HeldLease` reads."""

    __slots__ = ("held", "session_deadline")

    def __init__(self) -> None:
        self.held: dict[str, HeldLease] = {}
        self.session_deadline = -math.inf


class HeldLease:
    """A lease held through a :class:`~leases.LeaseHeartbeat`.

    ``token`` is the fencing token of the grant. Guard work with ``with lease.guard():``: the
    body is cancelled when the lease is lost (``lost`` becomes ``True``, ``lost_reason`` says
    why). A lease that is released or transferred stops being renewed; its guards are left
    alone.
    """

    __slots__ = (
        "_book", "_deadline", "_scopes", "in_session", "key", "lost", "lost_reason",
        "owner", "token",
    )

    def __init__(
        self,
        book: LeaseBook,
        key: str,
        owner: str,
        token: int | None,
        deadline: float,
        *,
        in_session: bool = False,
    ) -> None:
        self._book = book
        self.key = key
        self.owner = owner
        self.token = token
        self.in_session = in_session
        self._deadline = deadline
        self.lost = False
        self.lost_reason: str | None = None
        self._scopes: list[anyio.CancelScope] = []

    @property
    def deadline(self) -> float:
        """The local expiry estimate (``loop_time()`` scale): the session's, for a
        lease held in a session."""
        return self._book.session_deadline if self.in_session else self._deadline

    @deadline.setter
    def deadline(self, value: float) -> None:
        self._deadline = value

    @property
    def held(self) -> bool:
        """Still registered with the heartbeat and not lost."""
        return not self.lost and self._book.held.get(self.key) is self

    @contextmanager
    def guard(self) -> Iterator[anyio.CancelScope]:
        """Run the body in a cancel scope that is cancelled when this lease is lost."""
        with anyio.CancelScope() as scope:
            if self.lost:
                scope.cancel(f"lease {self.key!r} lost: {self.lost_reason}")
            self._scopes.append(scope)
            try:
                yield scope
            finally:
                self._scopes.remove(scope)

    def cancel_guards(self, reason: str) -> None:
        """Cancel every body this lease guards (without giving the lease up)."""
        for scope in self._scopes:
            scope.cancel(reason)

    def _mark_lost(self, reason: str) -> None:
        if self.lost:
            return
        self.lost, self.lost_reason = True, reason
        self.cancel_guards(f"lease {self.key!r} lost: {reason}")


