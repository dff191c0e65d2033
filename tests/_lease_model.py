"""A reference model of the lease contract for the state-machine tests.

Time is an *interval*: an operation sent at ``lo`` and answered at ``hi`` took effect at some
unknown moment in ``[lo, hi]``, so a lease it granted expires somewhere in
``[lo + ttl, hi + ttl]``. With an exact clock (the in-memory backend) ``lo == hi`` and the
model predicts every answer. With real time (Redis) a lease near its expiry is *unknown*: the
model accepts either outcome, and the observed answer tells which world we are in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from leases import AcquireResult

__all__ = ["LeaseModel", "ModelLease", "Op"]

Op = Literal["acquire", "renew", "release", "transfer", "owner", "info"]
Status = Literal["alive", "expired", "unknown"]


@dataclass(frozen=True)
class ModelLease:
    owner: str
    token: int
    exp_lo: float  # earliest moment the lease may expire
    exp_hi: float  # latest moment


Answer = object
Branch = tuple[Answer, "ModelLease | None", int]


class LeaseModel:
    """Key -> lease, plus the per-key fencing counter and every token granted so far."""

    def __init__(self) -> None:
        self.leases: dict[str, ModelLease] = {}
        self.fence: dict[str, int] = {}
        self.granted: dict[str, list[int]] = {}

    def status(self, key: str, lo: float, hi: float) -> Status | None:
        lease = self.leases.get(key)
        if lease is None:
            return None
        if hi < lease.exp_lo:
            return "alive"
        if lo >= lease.exp_hi:
            return "expired"
        return "unknown"

    @staticmethod
    def _predict(
        lease: ModelLease | None,
        fence: int,
        op: Op,
        args: tuple[object, ...],
        lo: float,
        hi: float,
    ) -> Branch:
        """The answer and the next state if the lease is ``lease`` (``None``: free)."""

        def fresh(owner: str, token: int, ttl_ms: int) -> ModelLease:
            return ModelLease(owner, token, lo + ttl_ms / 1000, hi + ttl_ms / 1000)

        if op == "acquire":
            owner, ttl = str(args[0]), int(str(args[1]))
            if lease is None:
                granted = fresh(owner, fence + 1, ttl)
                return AcquireResult(True, owner, fence + 1), granted, fence + 1
            if lease.owner == owner:
                refreshed = fresh(owner, lease.token, ttl)
                return AcquireResult(True, owner, lease.token), refreshed, fence
            return AcquireResult(False, lease.owner, None), lease, fence
        if op == "renew":
            owner, ttl = str(args[0]), int(str(args[1]))
            if lease is not None and lease.owner == owner:
                return True, fresh(owner, lease.token, ttl), fence
            return False, lease, fence
        if op == "release":
            owner = str(args[0])
            if lease is not None and lease.owner == owner:
                return None, None, fence
            return None, lease, fence
        if op == "transfer":
            src, dst, ttl = str(args[0]), str(args[1]), int(str(args[2]))
            if lease is None:
                return False, None, fence
            if lease.owner == dst:  # replay rule: to_owner already holds it
                return True, fresh(dst, lease.token, ttl), fence
            if lease.owner != src:
                return False, lease, fence
            return True, fresh(dst, fence + 1, ttl), fence + 1
        if op == "owner":
            return (None if lease is None else lease.owner), lease, fence
        if op == "info":
            return (None if lease is None else (lease.owner, lease.token)), lease, fence
        raise AssertionError(f"unknown op {op}")

    def apply(
        self, key: str, op: Op, args: tuple[object, ...], lo: float, hi: float, answer: Answer
    ) -> None:
        """Check ``answer`` (observed for ``op`` run during ``[lo, hi]``) and advance the model."""
        status = self.status(key, lo, hi)
        fence = self.fence.get(key, 0)
        current = self.leases.get(key)
        worlds: list[ModelLease | None]
        if status is None or status == "expired":
            worlds = [None]
        elif status == "alive":
            worlds = [current]
        else:
            worlds = [current, None]  # prefer "still alive" when both explain the answer
        branches = [self._predict(w, fence, op, args, lo, hi) for w in worlds]
        matching = [b for b in branches if b[0] == answer]
        assert matching, (
            f"{op}{args} on {key!r}: got {answer!r}, model expected "
            f"{' or '.join(repr(b[0]) for b in branches)} (lease {current}, status {status})"
        )
        _, lease, new_fence = matching[0]
        if new_fence != fence:
            assert lease is not None
            history = self.granted.setdefault(key, [])
            assert not history or lease.token > history[-1], "tokens must strictly increase"
            history.append(lease.token)
            self.fence[key] = new_fence
        if lease is None:
            self.leases.pop(key, None)
        else:
            self.leases[key] = lease
