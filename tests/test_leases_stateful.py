"""Hypothesis state machines: random acquire/renew/release/transfer/time sequences checked
against the reference model in ``tests/_lease_model.py``.

* the sync core (``LeaseTable``) with a manual clock: large budget, exact predictions;
* ``InMemoryLeaseProvider`` through a blocking portal, on asyncio and on trio;
* ``RedisLeaseProvider`` on the real server with real short TTLs (small budget; answers near
  an expiry are accepted either way and then pin the model down);
* ``SQLiteLeaseProvider`` on a real file, on asyncio and trio: with a manual clock under the
  database (exact predictions), and with the host clock and real short TTLs (small budget).
  Its tokens come from one counter for all keys, so the machine maps them to per-key grant
  numbers for the model (``GlobalTokens``), checking that they strictly increase.

Invariants after every step: the provider's ``(owner, token)`` view matches the model, tokens
of successive grants strictly increase per key, at most one owner per key (by construction of
the view), and non-owner operations fail (every answer is checked against the model).
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from _signal_leases.sql.sqlite import SQLiteDatabase
from leases import AcquireResult, InMemoryLeaseProvider, RedisLeaseProvider, SQLiteLeaseProvider
from leases._backends.memory import LeaseTable
from leases.testing import ManualClock
from tests._lease_model import LeaseModel, Op
from tests.test_leases_sqlite import ManualClockDatabase

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from leases import LeaseProvider

KEYS = ("k1", "k2")
OWNERS = ("a", "b", "c")

keys = st.sampled_from(KEYS)
owners = st.sampled_from(OWNERS)
choice = st.integers(0, 4)  # an index into the machine's TTL / time-step tables


class LeaseMachine(RuleBasedStateMachine):
    """Rules and invariants; subclasses say how to call the backend and what time is."""

    TTLS_MS: ClassVar[tuple[int, ...]] = (1, 5, 20, 50, 100)
    STEPS_MS: ClassVar[tuple[int, ...]] = (0, 1, 10, 50, 120)
    SLACK_S: ClassVar[float] = 0.0  # widening of each op's time window (real-time backends)

    def __init__(self) -> None:
        super().__init__()
        self.model = LeaseModel()

    # -- backend hooks ----------------------------------------------------------------------

    def invoke(self, op: Op, key: str, args: tuple[Any, ...]) -> object:
        raise NotImplementedError

    def now(self) -> float:
        raise NotImplementedError

    def sleep(self, ms: int) -> None:
        raise NotImplementedError

    # -- plumbing ---------------------------------------------------------------------------

    def run(self, op: Op, key: str, *args: Any) -> object:
        lo = self.now()
        answer = self.invoke(op, key, args)
        hi = self.now()
        self.model.apply(key, op, args, lo - self.SLACK_S, hi + self.SLACK_S, answer)
        return answer

    # -- rules ------------------------------------------------------------------------------

    @rule(key=keys, owner=owners, ttl=choice)
    def acquire(self, key: str, owner: str, ttl: int) -> None:
        self.run("acquire", key, owner, self.TTLS_MS[ttl])

    @rule(key=keys, owner=owners, ttl=choice)
    def renew(self, key: str, owner: str, ttl: int) -> None:
        self.run("renew", key, owner, self.TTLS_MS[ttl])

    @rule(key=keys, owner=owners)
    def release(self, key: str, owner: str) -> None:
        self.run("release", key, owner)

    @rule(key=keys, src=owners, dst=owners, ttl=choice)
    def transfer(self, key: str, src: str, dst: str, ttl: int) -> None:
        self.run("transfer", key, src, dst, self.TTLS_MS[ttl])

    @rule(key=keys)
    def owner(self, key: str) -> None:
        self.run("owner", key)

    @rule(step=choice)
    def advance_time(self, step: int) -> None:
        self.sleep(self.STEPS_MS[step])

    @invariant()
    def provider_view_matches_the_model(self) -> None:
        for key in KEYS:
            self.run("info", key)

    @invariant()
    def tokens_strictly_increase(self) -> None:
        for history in self.model.granted.values():
            assert all(a < b for a, b in itertools.pairwise(history)), history


class CoreMachine(LeaseMachine):
    """The pure sync core, with an exact manual clock."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock(1000.0)
        self.table = LeaseTable()

    def now(self) -> float:
        return self.clock()

    def sleep(self, ms: int) -> None:
        self.clock.advance(ms / 1000)

    def invoke(self, op: Op, key: str, args: tuple[Any, ...]) -> object:
        t, now = self.table, self.clock()
        if op == "acquire":
            return t.acquire(key, args[0], args[1], now)
        if op == "renew":
            return t.renew(key, args[0], args[1], now)
        if op == "release":
            t.release(key, args[0], now)
            return None
        if op == "transfer":
            return t.transfer(key, args[0], args[1], args[2], now)
        if op == "owner":
            return t.owner(key, now)
        info = t.info(key, now)
        if info is not None:
            lease = self.model.leases[key]
            assert info.ttl_ms_remaining is not None
            assert abs(info.ttl_ms_remaining - (lease.exp_hi - now) * 1000) < 1
        return None if info is None else (info.owner, info.token)


TestCoreMachine = CoreMachine.TestCase
TestCoreMachine.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)


class PortalMachine(LeaseMachine):
    """An async ``LeaseProvider`` driven from the test thread through a blocking portal."""

    backend: ClassVar[str] = "asyncio"

    def __init__(self) -> None:
        super().__init__()
        self._portal_cm: AbstractContextManager[BlockingPortal] = start_blocking_portal(
            self.backend
        )
        self.portal = self._portal_cm.__enter__()
        self.provider: LeaseProvider = self.portal.call(self.make_provider)

    async def make_provider(self) -> LeaseProvider:
        raise NotImplementedError

    async def close_provider(self) -> None:
        """Override to release what ``make_provider`` opened."""

    def teardown(self) -> None:
        try:
            self.portal.call(self.close_provider)
        finally:
            self._portal_cm.__exit__(None, None, None)

    def invoke(self, op: Op, key: str, args: tuple[Any, ...]) -> object:
        p, call = self.provider, self.portal.call
        if op == "acquire":
            return call(p.acquire_lease, key, *args)
        if op == "renew":
            return call(p.renew_lease, key, *args)
        if op == "release":
            return call(p.release_lease, key, *args)
        if op == "transfer":
            return call(p.transfer_lease, key, *args)
        if op == "owner":
            return call(p.get_lease_owner, key)
        info = call(p.lease_info, key)  # type: ignore[attr-defined]
        return None if info is None else (info.owner, info.token)


class MemoryPortalMachine(PortalMachine):
    def __init__(self) -> None:
        self.clock = ManualClock(1000.0)
        super().__init__()

    async def make_provider(self) -> LeaseProvider:
        return InMemoryLeaseProvider(clock=self.clock)

    def now(self) -> float:
        return self.clock()

    def sleep(self, ms: int) -> None:
        self.clock.advance(ms / 1000)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_in_memory_provider_state_machine(backend: str) -> None:
    machine = type(f"MemoryPortalMachine_{backend}", (MemoryPortalMachine,), {"backend": backend})
    run_state_machine_as_test(
        machine, settings=settings(max_examples=60, stateful_step_count=30, deadline=None)
    )


class RedisMachine(PortalMachine):
    """Real time: TTLs of tens of ms expire by themselves; time steps are real sleeps."""

    TTLS_MS = (15, 30, 60, 200, 60_000)
    STEPS_MS = (0, 5, 20, 40, 70)
    SLACK_S = 0.005  # Redis expires on its own (ms, wall) clock
    url: ClassVar[str] = ""

    async def make_provider(self) -> LeaseProvider:
        self.redis_provider = RedisLeaseProvider(url=self.url, key_prefix=uuid.uuid4().hex[:12])
        return self.redis_provider

    async def close_provider(self) -> None:
        await self.redis_provider.aclose()

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, ms: int) -> None:
        time.sleep(ms / 1000)


@pytest.mark.redis
def test_redis_provider_state_machine(redis_url: str) -> None:
    machine = type("RedisMachineOnServer", (RedisMachine,), {"url": redis_url})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=25,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


class GlobalTokens(LeaseMachine):
    """For a provider whose tokens come from one counter for all keys: each token is checked to
    be greater than every token seen before (of any key), then shown to the model as the
    per-key grant number the model expects for it, each number standing for one token only."""

    def __init__(self) -> None:
        super().__init__()
        self.numbers: dict[str, dict[int, int]] = {}  # key -> token -> grant number
        self.top = 0  # the greatest token seen

    def number(self, key: str, token: int, expected: int) -> int:
        numbers = self.numbers.setdefault(key, {})
        if token in numbers:
            return numbers[token]
        assert expected not in numbers.values(), f"{key}: new token {token}, expected the old one"
        assert token > self.top, f"{key}: token {token} after {self.top}"
        numbers[token], self.top = expected, token
        return expected

    def invoke(self, op: Op, key: str, args: tuple[Any, ...]) -> object:
        answer = super().invoke(op, key, args)
        fresh = self.model.fence.get(key, 0) + 1
        if op == "acquire" and isinstance(answer, AcquireResult) and answer.token is not None:
            number = self.number(key, answer.token, fresh)
            return AcquireResult(answer.acquired, answer.owner, number)
        if op == "info" and isinstance(answer, tuple):
            lease = self.model.leases.get(key)
            return answer[0], self.number(key, answer[1], lease.token if lease else fresh)
        return answer


class SQLiteMachine(GlobalTokens, PortalMachine):
    """The real host clock (the database's clock is ``time.monotonic()`` in ms, truncated)."""

    TTLS_MS = (15, 30, 60, 200, 60_000)
    STEPS_MS = (0, 5, 20, 40, 70)
    SLACK_S = 0.002

    async def make_provider(self) -> LeaseProvider:
        self.folder = tempfile.mkdtemp(prefix="leases-sqlite-")
        self.database = self.open_database(Path(self.folder) / "leases.db")
        return SQLiteLeaseProvider(database=self.database)

    def open_database(self, path: Path) -> SQLiteDatabase:
        return SQLiteDatabase(path)

    async def close_provider(self) -> None:
        await self.database.aclose()
        shutil.rmtree(self.folder)

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, ms: int) -> None:
        time.sleep(ms / 1000)


class SQLiteManualClockMachine(SQLiteMachine):
    """Exact time: the machine moves the database's clock. Every time is a multiple of 125 ms,
    so the model's float seconds are exact (k/8) and even the expiry instant is predicted."""

    TTLS_MS = (125, 250, 375, 500, 1000)
    STEPS_MS = (0, 125, 250, 375, 625)
    SLACK_S = 0.0

    def open_database(self, path: Path) -> SQLiteDatabase:
        self.clock = ManualClockDatabase(path)
        return self.clock

    def now(self) -> float:
        return self.clock.ms / 1000

    def sleep(self, ms: int) -> None:
        self.clock.ms += ms


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_sqlite_provider_state_machine_manual_clock(backend: str) -> None:
    machine = type(f"SQLiteManual_{backend}", (SQLiteManualClockMachine,), {"backend": backend})
    run_state_machine_as_test(
        machine, settings=settings(max_examples=40, stateful_step_count=30, deadline=None)
    )


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_sqlite_provider_state_machine_host_clock(backend: str) -> None:
    machine = type(f"SQLiteHost_{backend}", (SQLiteMachine,), {"backend": backend})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=10,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
