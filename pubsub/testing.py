"""A conformance suite for ``PubSub`` backends, run by pytest.

Subclass :class:`PubSubConformance` in a test module (the class name must start with ``Test``)
and override the ``pubsub`` fixture so that it yields a fresh, entered backend for each test;
pytest then runs every check against it. The checks are async and marked ``anyio``, so they run
on the backends your ``anyio_backend`` fixture selects (pin it to ``"asyncio"`` for an
asyncio-only client)::

    import pytest
    from collections.abc import AsyncIterator
    from pubsub.testing import PubSubConformance

    class TestMyPubSub(PubSubConformance):
        max_delivery_attempts = 3  # a smaller cap keeps the redelivery checks short

        @pytest.fixture
        async def pubsub(self) -> AsyncIterator[MyPubSub]:
            async with MyPubSub(max_delivery_attempts=self.max_delivery_attempts) as backend:
                yield backend

Knobs (class attributes you may override):

* :attr:`~PubSubConformance.max_delivery_attempts` (default
  :data:`~pubsub.DEFAULT_MAX_DELIVERY_ATTEMPTS`, 5): the redelivery cap the checks expect. Your
  fixture must build the backend with that value (``MyPubSub(max_delivery_attempts=
  self.max_delivery_attempts)``); if the backend exposes a ``max_delivery_attempts`` attribute
  that differs, the cap checks fail with a message saying so.
* :attr:`~PubSubConformance.delivery_timeout_s` (default 5): the longest a check waits for an
  expected delivery. Waits poll and end as soon as the condition holds, so raise it for a slow
  backend without slowing a fast one; no check asserts on elapsed time.

Every check uses fresh topic and group names, so one backend instance may serve all checks.

Over 400 lines on purpose: one conformance check per rule of the contract, kept in one
class so a backend author reads every rule in one file.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any, ClassVar

import anyio
import anyio.lowlevel
import pytest
import structlog.testing

from _signal_leases.errors import ClosedError
from pubsub._contract import DEFAULT_MAX_DELIVERY_ATTEMPTS, Event, PubSub, is_pubsub

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["PubSubConformance", "Recorder"]


class Recorder:
    """A handler that records each event it gets; optionally fails or blocks on some of them.

    ``fail(event)`` returning ``True`` makes that delivery raise. ``active``/``max_active``
    count overlapping calls (for the one-at-a-time check).
    """

    def __init__(self, fail: Callable[[Event], bool] | None = None) -> None:
        self.events: list[Event] = []
        self.active = 0
        self.max_active = 0
        self._fail = fail

    @property
    def data(self) -> list[Any]:
        return [e.data for e in self.events]

    async def __call__(self, event: Event) -> None:
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            self.events.append(event)
            await anyio.lowlevel.checkpoint()
            if self._fail is not None and self._fail(event):
                raise RuntimeError(f"handler failure on {event.data!r} #{event.delivery_attempt}")
        finally:
            self.active -= 1


@pytest.mark.anyio
class PubSubConformance:
    """Mix-in test class: every delivery semantic of the ``PubSub`` contract, one check each."""

    #: The redelivery cap the checks expect; build the backend in the fixture with this value.
    max_delivery_attempts: ClassVar[int] = DEFAULT_MAX_DELIVERY_ATTEMPTS
    #: The longest a check waits for an expected delivery, in seconds.
    delivery_timeout_s: ClassVar[float] = 5.0

    @pytest.fixture
    def pubsub(self) -> Any:
        """Override: yield a fresh, entered backend built with ``self.max_delivery_attempts``.

        ``async with Backend(max_delivery_attempts=self.max_delivery_attempts) as b: yield b``
        """
        raise NotImplementedError("override the `pubsub` fixture in your conformance class")

    # -- helpers ---------------------------------------------------------------------------

    @staticmethod
    def name(kind: str = "topic") -> str:
        """A topic or group name no other check uses."""
        return f"conformance-{kind}-{uuid.uuid4().hex[:12]}"

    async def wait_until(self, predicate: Callable[[], bool], what: str = "delivery") -> None:
        """Poll ``predicate`` until it is true; fail after :attr:`delivery_timeout_s`."""
        try:
            with anyio.fail_after(self.delivery_timeout_s):
                while not predicate():  # noqa: ASYNC110 - any predicate, not only an event
                    await anyio.sleep(0.005)
        except TimeoutError:
            pytest.fail(f"no {what} within delivery_timeout_s={self.delivery_timeout_s}s")

    def max_attempts(self, pubsub: PubSub) -> int:
        """:attr:`max_delivery_attempts`, after checking the backend was built with it."""
        actual = getattr(pubsub, "max_delivery_attempts", None)
        if actual is not None and actual != self.max_delivery_attempts:
            pytest.fail(
                f"the backend has max_delivery_attempts={actual!r} but the suite expects "
                f"{self.max_delivery_attempts}: build it in the `pubsub` fixture with "
                "`max_delivery_attempts=self.max_delivery_attempts` (or set the class attribute)"
            )
        return self.max_delivery_attempts

    async def publish_all(self, pubsub: PubSub, topic: str, data: list[Any]) -> list[str]:
        return [await pubsub.publish(topic, Event("conformance", d)) for d in data]

    # -- publish ---------------------------------------------------------------------------

    async def test_is_a_pubsub(self, pubsub: PubSub) -> None:
        assert isinstance(pubsub, PubSub)
        assert is_pubsub(pubsub)

    async def test_publish_returns_the_event_id(self, pubsub: PubSub) -> None:
        event = Event("conformance", {"n": 1})
        assert await pubsub.publish(self.name(), event) == event.id

    async def test_event_fields_survive_the_trip(self, pubsub: PubSub) -> None:
        topic, got = self.name(), Recorder()
        await pubsub.subscribe(topic, got)
        sent = Event("conformance.kind", {"a": [1, 2.5, "x", None, True], "b": {"c": "é"}})
        await pubsub.publish(topic, sent)
        await self.wait_until(lambda: len(got.events) == 1)
        (event,) = got.events
        assert (event.id, event.type, event.data) == (sent.id, sent.type, sent.data)
        assert event.created_at == pytest.approx(sent.created_at)
        assert event.delivery_attempt == 1

    async def test_non_event_is_rejected(self, pubsub: PubSub) -> None:
        with pytest.raises(TypeError):
            await pubsub.publish(self.name(), {"type": "x"})  # type: ignore[arg-type]

    async def test_non_json_data_is_rejected(self, pubsub: PubSub) -> None:
        with pytest.raises(TypeError):
            Event("conformance", {"when": object()})
        event = Event("conformance", {"ok": 1})
        event.data["later"] = {1, 2}  # mutated after construction
        with pytest.raises(TypeError):
            await pubsub.publish(self.name(), event)

    async def test_empty_topic_is_rejected(self, pubsub: PubSub) -> None:
        with pytest.raises(ValueError):
            await pubsub.publish("", Event("conformance"))
        with pytest.raises(ValueError):
            await pubsub.subscribe("", Recorder())
        with pytest.raises(TypeError):
            await pubsub.publish(None, Event("conformance"))  # type: ignore[arg-type]

    # -- fan-out and groups ----------------------------------------------------------------

    async def test_fanout_every_subscription_gets_every_event(self, pubsub: PubSub) -> None:
        topic = self.name()
        recorders = [Recorder() for _ in range(3)]
        for r in recorders:
            await pubsub.subscribe(topic, r)
        await self.publish_all(pubsub, topic, list(range(5)))
        await self.wait_until(lambda: all(len(r.events) >= 5 for r in recorders))
        for r in recorders:
            assert r.data == list(range(5))

    async def test_group_members_compete(self, pubsub: PubSub) -> None:
        topic, group = self.name(), self.name("group")
        members = [Recorder() for _ in range(3)]
        subs = [await pubsub.subscribe(topic, m, group=group) for m in members]
        ids = await self.publish_all(pubsub, topic, list(range(30)))
        await self.wait_until(lambda: {e.id for m in members for e in m.events} >= set(ids))
        for sub in subs:
            await sub.close()
        seen = [e.id for m in members for e in m.events]
        assert sorted(seen) == sorted(ids), "each event goes to exactly one member of a group"

    async def test_groups_and_fanout_each_get_every_event(self, pubsub: PubSub) -> None:
        topic = self.name()
        group_a, group_b, fan = Recorder(), Recorder(), Recorder()
        await pubsub.subscribe(topic, group_a, group=self.name("group"))
        await pubsub.subscribe(topic, group_b, group=self.name("group"))
        await pubsub.subscribe(topic, fan)
        await self.publish_all(pubsub, topic, ["x", "y"])
        await self.wait_until(lambda: all(len(r.events) >= 2 for r in (group_a, group_b, fan)))
        assert group_a.data == group_b.data == fan.data == ["x", "y"]

    async def test_topics_are_separate(self, pubsub: PubSub) -> None:
        first, second = self.name(), self.name()
        got = Recorder()
        await pubsub.subscribe(first, got)
        await pubsub.publish(second, Event("conformance", "other"))
        await pubsub.publish(first, Event("conformance", "mine"))
        await self.wait_until(lambda: len(got.events) >= 1)
        assert got.data == ["mine"]

    async def test_many_topics_at_once(self, pubsub: PubSub) -> None:
        topics = [self.name() for _ in range(20)]
        fan = {t: Recorder() for t in topics}
        grouped = {t: Recorder() for t in topics}
        for t in topics:
            await pubsub.subscribe(t, fan[t])
            await pubsub.subscribe(t, grouped[t], group=self.name("group"))
        async with anyio.create_task_group() as tg:  # publishers on every topic at once
            for t in topics:
                tg.start_soon(self.publish_all, pubsub, t, [f"{t}/{i}" for i in range(3)])
        recorders = [*fan.values(), *grouped.values()]
        await self.wait_until(lambda: all(len(r.events) >= 3 for r in recorders))
        for t in topics:
            expected = [f"{t}/{i}" for i in range(3)]
            assert fan[t].data == expected, "each topic's events, in order, and only those"
            assert grouped[t].data == expected

    # -- acknowledgement and redelivery ----------------------------------------------------

    @pytest.mark.parametrize("grouped", [False, True], ids=["fanout", "group"])
    async def test_returning_acknowledges(self, pubsub: PubSub, grouped: bool) -> None:
        topic, got = self.name(), Recorder()
        await pubsub.subscribe(topic, got, group=self.name("group") if grouped else None)
        await self.publish_all(pubsub, topic, ["a", "b"])
        await self.wait_until(lambda: len(got.events) >= 2)
        assert got.data == ["a", "b"]
        assert [e.delivery_attempt for e in got.events] == [1, 1]

    @pytest.mark.parametrize("grouped", [False, True], ids=["fanout", "group"])
    async def test_raising_redelivers_in_place(self, pubsub: PubSub, grouped: bool) -> None:
        topic = self.name()
        succeed_at = min(3, self.max_attempts(pubsub))  # fails before, within the cap
        got = Recorder(fail=lambda e: e.data == "flaky" and e.delivery_attempt < succeed_at)
        await pubsub.subscribe(topic, got, group=self.name("group") if grouped else None)
        ids = await self.publish_all(pubsub, topic, ["flaky", "next"])
        await self.wait_until(lambda: "next" in got.data)
        assert [(e.id, e.data, e.delivery_attempt) for e in got.events] == [
            *((ids[0], "flaky", n) for n in range(1, succeed_at + 1)),
            (ids[1], "next", 1),
        ], "a failed event is retried before the next one, with delivery_attempt + 1"

    @pytest.mark.parametrize("grouped", [False, True], ids=["fanout", "group"])
    async def test_dropped_after_max_delivery_attempts(
        self, pubsub: PubSub, grouped: bool
    ) -> None:
        topic, group = self.name(), self.name("group") if grouped else None
        cap = self.max_attempts(pubsub)
        got = Recorder(fail=lambda e: e.data == "poison")
        await pubsub.subscribe(topic, got, group=group)
        with structlog.testing.capture_logs() as logs:
            ids = await self.publish_all(pubsub, topic, ["poison", "after"])
            await self.wait_until(lambda: "after" in got.data)
        attempts = [e.delivery_attempt for e in got.events if e.data == "poison"]
        assert attempts == list(range(1, cap + 1))
        assert got.events[-1].data == "after", "the subscription keeps going after a drop"
        dropped = [entry for entry in logs if entry["event"] == "pubsub.event_dropped"]
        assert len(dropped) == 1, logs
        assert dropped[0]["log_level"] == "warning"
        assert dropped[0]["event_id"] == ids[0]
        assert dropped[0]["attempts"] == cap
        assert dropped[0]["topic"] == topic
        assert dropped[0]["group"] == group

    # -- order -----------------------------------------------------------------------------

    @pytest.mark.parametrize("grouped", [False, True], ids=["fanout", "group"])
    async def test_one_at_a_time_in_publish_order(self, pubsub: PubSub, grouped: bool) -> None:
        topic, got = self.name(), Recorder()
        await pubsub.subscribe(topic, got, group=self.name("group") if grouped else None)
        async with anyio.create_task_group() as tg:  # publishers racing the handler
            tg.start_soon(self.publish_all, pubsub, topic, list(range(40)))
        await self.wait_until(lambda: len(got.events) >= 40)
        assert got.data == list(range(40))
        assert got.max_active == 1

    # -- start position --------------------------------------------------------------------

    @pytest.mark.parametrize("grouped", [False, True], ids=["fanout", "group"])
    async def test_earliest_replays_retained_events(self, pubsub: PubSub, grouped: bool) -> None:
        topic, got = self.name(), Recorder()
        await self.publish_all(pubsub, topic, ["old-1", "old-2"])
        group = self.name("group") if grouped else None
        await pubsub.subscribe(topic, got, group=group, start_from="earliest")
        await pubsub.publish(topic, Event("conformance", "new"))
        await self.wait_until(lambda: "new" in got.data)
        assert got.data == ["old-1", "old-2", "new"]

    async def test_earliest_replays_next_to_a_live_subscription(self, pubsub: PubSub) -> None:
        topic, live, late = self.name(), Recorder(), Recorder()
        await pubsub.subscribe(topic, live)
        await self.publish_all(pubsub, topic, ["a", "b"])
        await self.wait_until(lambda: len(live.events) >= 2)
        await pubsub.subscribe(topic, late, start_from="earliest")
        await pubsub.publish(topic, Event("conformance", "c"))
        await self.wait_until(lambda: "c" in late.data and "c" in live.data)
        assert late.data == ["a", "b", "c"]
        assert live.data == ["a", "b", "c"]

    @pytest.mark.parametrize("grouped", [False, True], ids=["fanout", "group"])
    async def test_latest_sees_only_later_events(self, pubsub: PubSub, grouped: bool) -> None:
        topic, got = self.name(), Recorder()
        await pubsub.publish(topic, Event("conformance", "before"))
        await pubsub.subscribe(topic, got, group=self.name("group") if grouped else None)
        await pubsub.publish(topic, Event("conformance", "after"))
        await self.wait_until(lambda: "after" in got.data)
        assert got.data == ["after"]

    async def test_latest_next_to_a_live_subscription(self, pubsub: PubSub) -> None:
        topic, live, late = self.name(), Recorder(), Recorder()
        await pubsub.subscribe(topic, live)
        await pubsub.publish(topic, Event("conformance", "before"))
        await pubsub.subscribe(topic, late)
        await pubsub.publish(topic, Event("conformance", "after"))
        await self.wait_until(lambda: "after" in late.data and "after" in live.data)
        assert late.data == ["after"]
        assert live.data == ["before", "after"]

    async def test_existing_group_keeps_its_position(self, pubsub: PubSub) -> None:
        topic, group = self.name(), self.name("group")
        first = Recorder()
        sub = await pubsub.subscribe(topic, first, group=group, start_from="earliest")
        await self.publish_all(pubsub, topic, ["a", "b"])
        await self.wait_until(lambda: len(first.events) >= 2)
        await sub.close()
        await pubsub.publish(topic, Event("conformance", "while-away"))
        again = Recorder()
        await pubsub.subscribe(topic, again, group=group, start_from="earliest")
        await pubsub.publish(topic, Event("conformance", "back"))
        await self.wait_until(lambda: "back" in again.data)
        assert again.data == ["while-away", "back"], (
            "a group resumes where it stopped: no replay of handled events (despite earliest) "
            "and nothing published meanwhile is skipped (whatever start_from says)"
        )

    # -- closing ---------------------------------------------------------------------------

    async def test_closed_subscription_gets_nothing(self, pubsub: PubSub) -> None:
        topic, closed, witness = self.name(), Recorder(), Recorder()
        sub = await pubsub.subscribe(topic, closed)
        await pubsub.subscribe(topic, witness)
        await pubsub.publish(topic, Event("conformance", 1))
        await self.wait_until(lambda: len(closed.events) >= 1 and len(witness.events) >= 1)
        await sub.close()
        await sub.close()  # idempotent
        await self.publish_all(pubsub, topic, [2, 3])
        await self.wait_until(lambda: len(witness.events) >= 3)
        assert closed.data == [1]

    async def test_unsubscribe_closes(self, pubsub: PubSub) -> None:
        topic, gone, witness = self.name(), Recorder(), Recorder()
        sub = await pubsub.subscribe(topic, gone, group=self.name("group"))
        await pubsub.subscribe(topic, witness)
        await pubsub.unsubscribe(sub)
        await pubsub.publish(topic, Event("conformance", "x"))
        await self.wait_until(lambda: len(witness.events) >= 1)
        assert gone.events == []

    async def test_close_lets_the_inflight_handler_finish(self, pubsub: PubSub) -> None:
        topic = self.name()
        started, release = anyio.Event(), anyio.Event()
        finished: list[Any] = []

        async def handler(event: Event) -> None:
            started.set()
            await release.wait()
            await anyio.lowlevel.checkpoint()  # after the wait: still not cancelled
            finished.append(event.data)

        sub = await pubsub.subscribe(topic, handler)
        await pubsub.publish(topic, Event("conformance", "slow"))
        with anyio.fail_after(self.delivery_timeout_s):
            await started.wait()
        closed = anyio.Event()

        async def close() -> None:
            await sub.close()
            closed.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(close)
            for _ in range(20):
                await anyio.lowlevel.checkpoint()
            assert not closed.is_set(), "close() returned while the handler was running"
            release.set()
            with anyio.fail_after(self.delivery_timeout_s):
                await closed.wait()
        assert finished == ["slow"]

    async def test_closed_pubsub_refuses_use(self, pubsub: PubSub) -> None:
        await pubsub.close()
        await pubsub.close()  # idempotent
        with pytest.raises(ClosedError):
            await pubsub.subscribe(self.name(), Recorder())
        with pytest.raises(ClosedError):
            await pubsub.publish(self.name(), Event("conformance"))

    async def test_close_stops_every_subscription(self, pubsub: PubSub) -> None:
        topic, got = self.name(), Recorder()
        await pubsub.subscribe(topic, got)
        await pubsub.subscribe(topic, got, group=self.name("group"))
        await pubsub.close()
        assert got.events == []

