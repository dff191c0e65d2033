"""A custom backend, written as a user would: pub/sub and leases in one small class.

``LogBackend`` keeps, per topic, an append-only list of events and, per consumer group, a
cursor into it; leases live in a dict. It only uses the public API (``pubsub.PubSub``,
``pubsub.Subscription``, ``pubsub.Event``, ``leases.AcquireResult``), passes both conformance
suites (``tests/test_custom_backend.py`` runs them) and is detected structurally as a lease
provider, so ``SignalRuntime(pubsub=LogBackend(), ...)`` takes its leases from it.

    python examples/custom_backend.py      # a tiny demo on asyncio
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self

import anyio
import anyio.abc
import anyio.lowlevel
import structlog

import leases
from leases import AcquireResult
from pubsub import Event, EventHandler, PubSub, PubSubClosedError, StartFrom, Subscription

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


class _LogSubscription(Subscription):
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


class LogBackend(PubSub):
    """In-process pub/sub over per-topic logs, plus leases with fencing tokens."""

    def __init__(
        self, *, max_delivery_attempts: int = 5, clock: Callable[[], float] | None = None
    ) -> None:
        self.max_delivery_attempts = max_delivery_attempts
        self._clock = clock or anyio.current_time
        self._topics: dict[str, _Topic] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self._subs: set[_LogSubscription] = set()
        self._closed = False
        self._leases: dict[str, tuple[str, float, int]] = {}  # key -> owner, expiry, token
        self._tokens: dict[str, int] = {}

    # -- pub/sub ---------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._closed = True
        if self._tg is None:
            return
        try:
            if et is None:
                await self.close()  # a clean exit lets in-flight handlers finish
        finally:
            self._tg.cancel_scope.cancel()
            await self._tg.__aexit__(None, None, None)  # the body's own error propagates

    async def close(self) -> None:
        # Close the subscriptions, not the task group's scope: cancelling that scope would
        # also cancel the code inside the caller's `async with` block.
        self._closed = True
        for sub in list(self._subs):
            await sub.close()

    def _open(self) -> anyio.abc.TaskGroup:
        if self._closed or self._tg is None:
            raise PubSubClosedError("LogBackend is not open")
        return self._tg

    async def publish(self, topic: str, event: Event) -> str:
        _name(topic, "topic")
        if not isinstance(event, Event):
            raise TypeError("publish takes a pubsub.Event")
        json.dumps(event.data)
        self._open()
        self._topics.setdefault(topic, _Topic()).append(event)
        await anyio.lowlevel.checkpoint()
        return event.id

    async def subscribe(
        self,
        topic: str,
        handler: EventHandler,
        *,
        group: str | None = None,
        start_from: StartFrom = "latest",
    ) -> Subscription:
        _name(topic, "topic")
        if group is not None:
            _name(group, "group")
        if start_from not in ("latest", "earliest"):
            raise ValueError("start_from must be 'latest' or 'earliest'")
        tg = self._open()
        state = self._topics.setdefault(topic, _Topic())
        start = 0 if start_from == "earliest" else len(state.log)
        if group is not None:
            state.cursors.setdefault(group, start)
        sub = _LogSubscription(topic, group)
        self._subs.add(sub)
        tg.start_soon(self._deliver, sub, state, handler, start)
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
        self, sub: _LogSubscription, state: _Topic, handler: EventHandler, start: int
    ) -> None:
        mine = [start]
        try:
            with sub.scope:
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
            self._subs.discard(sub)
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
    from signals import InMemorySignalInbox, Run, SignalRuntime

    async def agent(run: Run) -> None:
        async for signal in run:
            print(f"run {run.run_id[:12]} token={run.token}: {signal.payload}")

    backend = LogBackend()
    print("is a lease provider:", leases.is_lease_provider(backend))
    # The backend is one process's memory, so the inbox is too (a shared backend would offer a
    # shared inbox: the runtime refuses shared leases with a process-local inbox).
    inbox = InMemorySignalInbox()
    async with backend, SignalRuntime(pubsub=backend, agent=agent, inbox=inbox) as runtime:
        assert runtime.leases is backend
        for text in ("hello", "world"):
            delivery = await runtime.send("demo-thread", text)
            print(f"send {text!r} -> {delivery.outcome}")
        await runtime.wait_idle()


if __name__ == "__main__":
    anyio.run(_demo)
