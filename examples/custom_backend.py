"""A custom backend, written as a user would: pub/sub and leases in one small class.

``LogBackend`` keeps, per topic, an append-only list of events and, per consumer group, a
cursor into it; leases live in a dict. It only uses the public API: it inherits
``pubsub.PubSubBase``, which validates every ``publish``/``subscribe`` call, runs the
``async with`` lifecycle (a task group for the delivery tasks, a graceful close) and offers
``extension()``, so the class only stores events and delivers them. Its leases are the five
``leases.LeaseProvider`` methods, detected structurally. It passes both conformance suites
(``tests/test_custom_backend.py`` runs them), so ``SignalRuntime(pubsub=LogBackend(), ...)``
takes its leases from it.

    python examples/custom_backend.py      # a tiny demo on asyncio
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
import anyio.abc
import anyio.lowlevel
import structlog

import leases
import pubsub
from leases import AcquireResult
from pubsub import Event, EventHandler, PubSubBase, StartFrom

log = structlog.get_logger("custom_backend")


def _name(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str")
    if not value:
        raise ValueError(f"{what} must not be empty")
    return value


def _ttl(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("ttl_ms must be an int")
    if value <= 0:
        raise ValueError("ttl_ms must be positive")
    return value


@dataclass
class _Topic:
    log: list[Event] = field(default_factory=list)
    cursors: dict[str, int] = field(default_factory=dict)  # group -> next index
    changed: anyio.Event = field(default_factory=anyio.Event)

    def append(self, event: Event) -> None:
        self.log.append(event)
        self.changed.set()
        self.changed = anyio.Event()


class _LogSubscription:
    """A ``pubsub.Subscription`` (structurally: ``topic``, ``group``, ``close``)."""

    def __init__(self, topic: str, group: str | None) -> None:
        self.topic, self.group = topic, group
        self.scope = anyio.CancelScope()
        self.busy = self.closing = False
        self.done = anyio.Event()

    async def close(self) -> None:
        self.closing = True
        if not self.busy:
            self.scope.cancel()
        await self.done.wait()


class LogBackend(PubSubBase):
    """In-process pub/sub over per-topic logs, plus leases with fencing tokens."""

    def __init__(
        self, *, max_delivery_attempts: int = 5, clock: Callable[[], float] | None = None
    ) -> None:
        super().__init__(max_delivery_attempts=max_delivery_attempts)
        self._clock = clock or anyio.current_time
        self._topics: dict[str, _Topic] = {}
        self._leases: dict[str, tuple[str, float, int]] = {}  # key -> owner, expiry, token
        self._tokens: dict[str, int] = {}

    # -- pub/sub: the base class validated the arguments and checked that we are open --------

    async def backend_publish(self, topic: str, event: Event, wire: str) -> None:
        self._topics.setdefault(topic, _Topic()).append(event)
        await anyio.lowlevel.checkpoint()

    async def backend_subscribe(
        self, topic: str, handler: EventHandler, *, group: str | None, start_from: StartFrom
    ) -> _LogSubscription:
        state = self._topics.setdefault(topic, _Topic())
        start = 0 if start_from == "earliest" else len(state.log)
        if group is not None:
            state.cursors.setdefault(group, start)
        sub = _LogSubscription(topic, group)
        await self.task_group.start(self._deliver, sub, state, handler, start)
        return sub

    def _next(self, sub: _LogSubscription, state: _Topic, mine: list[int]) -> Event | None:
        if sub.group is None:
            if mine[0] < len(state.log):
                mine[0] += 1
                return state.log[mine[0] - 1]
            return None
        index = state.cursors[sub.group]
        if index < len(state.log):
            state.cursors[sub.group] = index + 1
            return state.log[index]
        return None

    async def _deliver(
        self,
        sub: _LogSubscription,
        state: _Topic,
        handler: EventHandler,
        start: int,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        mine = [start]
        try:
            with sub.scope:
                task_status.started()
                while not sub.closing:
                    event = self._next(sub, state, mine)
                    if event is None:
                        await state.changed.wait()
                        continue
                    sub.busy = True
                    try:
                        await self._handle(sub, handler, event)
                    finally:
                        sub.busy = False
        finally:
            sub.done.set()

    async def _handle(self, sub: _LogSubscription, handler: EventHandler, event: Event) -> None:
        while True:
            try:
                await handler(event)
                return
            except Exception:
                if event.delivery_attempt >= self.max_delivery_attempts:
                    log.warning(
                        "pubsub.event_dropped", topic=sub.topic, group=sub.group,
                        event_id=event.id, attempts=event.delivery_attempt,
                    )
                    return
                event = event.redelivered()

    # -- leases ----------------------------------------------------------------------------

    def _live(self, key: str) -> tuple[str, float, int] | None:
        held = self._leases.get(key)
        if held is not None and held[1] <= self._clock():
            del self._leases[key]
            return None
        return held

    def _grant(self, key: str, owner: str, ttl_ms: int) -> int:
        token = self._tokens[key] = self._tokens.get(key, 0) + 1
        self._leases[key] = (owner, self._clock() + ttl_ms / 1000, token)
        return token

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> AcquireResult:
        _name(key, "key"), _name(owner, "owner"), _ttl(ttl_ms)
        await anyio.lowlevel.checkpoint()
        held = self._live(key)
        if held is None:
            return AcquireResult(True, owner, self._grant(key, owner, ttl_ms))
        if held[0] == owner:
            self._leases[key] = (owner, self._clock() + ttl_ms / 1000, held[2])
            return AcquireResult(True, owner, held[2])
        return AcquireResult(False, held[0], None)

    async def get_lease_owner(self, key: str) -> str | None:
        _name(key, "key")
        await anyio.lowlevel.checkpoint()
        held = self._live(key)
        return held[0] if held else None

    async def release_lease(self, key: str, owner: str) -> None:
        _name(key, "key"), _name(owner, "owner")
        await anyio.lowlevel.checkpoint()
        held = self._live(key)
        if held is not None and held[0] == owner:
            del self._leases[key]

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        _name(key, "key"), _name(owner, "owner"), _ttl(ttl_ms)
        await anyio.lowlevel.checkpoint()
        held = self._live(key)
        if held is None or held[0] != owner:
            return False
        self._leases[key] = (owner, self._clock() + ttl_ms / 1000, held[2])
        return True

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        _name(key, "key"), _name(from_owner, "from_owner"), _name(to_owner, "to_owner")
        _ttl(ttl_ms)
        await anyio.lowlevel.checkpoint()
        held = self._live(key)
        if held is not None and held[0] == to_owner:  # a replayed transfer
            self._leases[key] = (to_owner, self._clock() + ttl_ms / 1000, held[2])
            return True
        if held is None or held[0] != from_owner:
            return False
        self._grant(key, to_owner, ttl_ms)
        return True


async def _demo() -> None:
    from signals import InMemorySignalStore, Run, SignalRuntime

    async def agent(run: Run) -> None:
        async for signal in run:
            print(f"run {run.run_id[:12]} token={run.token}: {signal.payload}")

    backend = LogBackend()
    print("is a pub/sub:", pubsub.is_pubsub(backend))
    print("is a lease provider:", leases.is_lease_provider(backend))
    # The backend is one process's memory, so the inbox is too (a shared backend would offer a
    # shared inbox: the runtime refuses shared leases with a process-local inbox).
    inbox = InMemorySignalStore()
    async with backend, SignalRuntime(pubsub=backend, agent=agent, inbox=inbox) as runtime:
        assert runtime.leases is backend
        for text in ("hello", "world"):
            delivery = await runtime.send("demo-thread", text)
            print(f"send {text!r} -> {delivery.outcome}")
        await runtime.wait_idle()


if __name__ == "__main__":
    anyio.run(_demo)
