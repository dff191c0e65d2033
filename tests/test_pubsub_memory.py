"""InMemoryPubSub specifics (the shared semantics are in test_pubsub_conformance.py).

Runs on asyncio and trio (anyio's default parametrisation).
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest
import structlog.testing

import leases
from pubsub import (
    DEFAULT_MAX_DELIVERY_ATTEMPTS,
    ClosedError,
    Event,
    EventHandler,
    InMemoryPubSub,
    PubSub,
    is_pubsub,
)
from pubsub.testing import Recorder

pytestmark = pytest.mark.anyio


async def _until(predicate: object) -> None:
    with anyio.fail_after(5):
        while not predicate():  # type: ignore[operator]  # noqa: ASYNC110
            await anyio.sleep(0.001)


def test_constructor_validates() -> None:
    for bad in (0, -1):
        with pytest.raises(ValueError, match="max_delivery_attempts"):
            InMemoryPubSub(max_delivery_attempts=bad)
    with pytest.raises(TypeError):
        InMemoryPubSub(max_delivery_attempts=2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="retain"):
        InMemoryPubSub(retain=-1)
    assert isinstance(InMemoryPubSub(), PubSub)
    typed: PubSub = InMemoryPubSub()  # mypy checks the class against the protocol
    assert is_pubsub(typed)
    assert not is_pubsub(InMemoryPubSub), "a class is not a pub/sub"
    assert not is_pubsub("redis://localhost")


def test_an_event_survives_its_wire_form_and_a_malformed_one_is_refused() -> None:
    event = Event("e", {"text": "h\u00e9", "n": [1, 2.5, None, True]}, delivery_attempt=3)
    for wire in (event.to_json(), event.to_json().encode()):
        assert Event.from_json(wire) == event
        assert Event.from_json(wire).delivery_attempt == 3
    cases: list[tuple[str | bytes, type[Exception]]] = [
        ('{"type":"e","id":"x","created_at":1,"data":Infinity}', ValueError),
        ('{"type":"","id":"x","created_at":1}', ValueError),
        ('{"type":"e","id":["x"],"created_at":1}', TypeError),
        ('{"type":"e","created_at":1}', KeyError),
        ("[]", ValueError),
        (b"\xff", ValueError),
    ]
    for bad, error in cases:
        with pytest.raises(error):
            Event.from_json(bad)


async def test_use_before_entering_is_refused_clearly() -> None:
    ps = InMemoryPubSub()
    with pytest.raises(ClosedError, match="async with"):
        await ps.publish("t", Event("e"))
    with pytest.raises(ClosedError, match="async with"):
        await ps.subscribe("t", Recorder())


async def test_entered_once_and_closed_after_exit() -> None:
    ps = InMemoryPubSub()
    async with ps:
        # anyio.AsyncContextManagerMixin refuses a nested entry itself, with a RuntimeError
        # (ClosedError is one too).
        with pytest.raises(RuntimeError, match="entered"):
            async with ps:
                pass
    with pytest.raises(ClosedError, match="closed"):
        await ps.publish("t", Event("e"))
    with pytest.raises(ClosedError, match="entered once"):
        async with ps:
            pass


async def test_earliest_replays_only_the_last_retain_events() -> None:
    got = Recorder()
    async with InMemoryPubSub(retain=2) as ps:
        for i in range(5):
            await ps.publish("t", Event("e", i))
        await ps.subscribe("t", got, start_from="earliest")
        await ps.publish("t", Event("e", "live"))
        await _until(lambda: "live" in got.data)
    assert got.data == [3, 4, "live"]


async def test_retain_zero_keeps_nothing() -> None:
    got = Recorder()
    async with InMemoryPubSub(retain=0) as ps:
        await ps.publish("t", Event("e", "old"))
        await ps.subscribe("t", got, start_from="earliest")
        await ps.publish("t", Event("e", "new"))
        await _until(lambda: "new" in got.data)
    assert got.data == ["new"]


async def test_group_keeps_events_while_it_has_no_member() -> None:
    first, second = Recorder(), Recorder()
    async with InMemoryPubSub() as ps:
        sub = await ps.subscribe("t", first, group="g")
        await sub.close()
        await ps.publish("t", Event("e", "queued"))
        await ps.subscribe("t", second, group="g")
        await _until(lambda: second.data == ["queued"])
    assert first.events == []


async def test_group_members_share_the_load() -> None:
    members = [Recorder() for _ in range(3)]
    gate = anyio.Event()

    def slow(recorder: Recorder) -> EventHandler:
        async def handler(event: Event) -> None:
            await recorder(event)
            await gate.wait()

        return handler

    async with InMemoryPubSub() as ps:
        for m in members:
            await ps.subscribe("t", slow(m), group="g")
        for i in range(3):
            await ps.publish("t", Event("e", i))
        await _until(lambda: all(m.events for m in members))
        gate.set()
    assert sorted(d for m in members for d in m.data) == [0, 1, 2]


async def test_exit_waits_for_the_inflight_handler() -> None:
    finished: list[str] = []
    started = anyio.Event()

    async def handler(event: Event) -> None:
        started.set()
        await anyio.sleep(0.01)
        finished.append(event.data)

    async with InMemoryPubSub() as ps:
        await ps.subscribe("t", handler)
        await ps.publish("t", Event("e", "x"))
        await started.wait()
    assert finished == ["x"]


async def test_exit_on_error_cancels_handlers() -> None:
    cancelled: list[bool] = []

    async def handler(event: Event) -> None:
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cancelled.append(True)
            raise

    with pytest.raises(RuntimeError, match="boom"):
        async with InMemoryPubSub() as ps:
            await ps.subscribe("t", handler)
            await ps.publish("t", Event("e"))
            await anyio.sleep(0.01)
            raise RuntimeError("boom")
    assert cancelled == [True]


async def test_handler_errors_never_reach_the_caller() -> None:
    async def handler(event: Event) -> None:
        raise ValueError("always")

    async with InMemoryPubSub(max_delivery_attempts=2) as ps:
        await ps.subscribe("t", handler)
        await ps.publish("t", Event("e"))
        got = Recorder()
        await ps.subscribe("t", got)
        await ps.publish("t", Event("e", "after"))
        await _until(lambda: got.data == ["after"])


async def test_subscribe_validates() -> None:
    async with InMemoryPubSub() as ps:
        with pytest.raises(ValueError, match="group"):
            await ps.subscribe("t", Recorder(), group="")
        with pytest.raises(ValueError, match="start_from"):
            await ps.subscribe("t", Recorder(), start_from="middle")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="handler"):
            await ps.subscribe("t", "not callable")  # type: ignore[arg-type]


def test_constructor_rejects_bad_types() -> None:
    with pytest.raises(TypeError, match="max_delivery_attempts"):
        InMemoryPubSub(max_delivery_attempts=True)
    with pytest.raises(TypeError, match="max_delivery_attempts"):
        InMemoryPubSub(max_delivery_attempts="5")  # type: ignore[arg-type]
    for bad in (True, 1.5, "10"):  # the library's one rule: a wrong type is a TypeError
        with pytest.raises(TypeError, match="retain"):
            InMemoryPubSub(retain=bad)  # type: ignore[arg-type]
    assert InMemoryPubSub().max_delivery_attempts == DEFAULT_MAX_DELIVERY_ATTEMPTS
    assert InMemoryPubSub(max_delivery_attempts=1).max_delivery_attempts == 1


async def test_use_after_close_is_refused() -> None:
    async with InMemoryPubSub() as ps:
        await ps.close()
        with pytest.raises(ClosedError, match="closed"):
            await ps.publish("t", Event("e"))
        with pytest.raises(ClosedError, match="closed"):
            await ps.subscribe("t", Recorder())


async def test_retain_bounds_memory_per_topic() -> None:
    got = Recorder()
    async with InMemoryPubSub(retain=3) as ps:
        for i in range(100):
            await ps.publish("a", Event("e", i))
        await ps.publish("b", Event("e", "b-only"))
        await ps.subscribe("a", got, start_from="earliest")
        await ps.subscribe("b", got, group="g", start_from="earliest")
        await _until(lambda: len(got.events) >= 4)
    assert sorted(map(str, got.data)) == ["97", "98", "99", "b-only"]


@pytest.mark.parametrize("group", [None, "g"])
async def test_event_dropped_is_logged(group: str | None) -> None:
    got = Recorder(fail=lambda e: e.data == "poison")
    with structlog.testing.capture_logs() as logs:
        async with InMemoryPubSub(max_delivery_attempts=2) as ps:
            await ps.subscribe("t", got, group=group)
            poison = Event("e", "poison")
            await ps.publish("t", poison)
            await ps.publish("t", Event("e", "ok"))
            await _until(lambda: "ok" in got.data)
    assert [e.delivery_attempt for e in got.events] == [1, 2, 1]
    failed = [entry for entry in logs if entry["event"] == "pubsub.handler_failed"]
    dropped = [entry for entry in logs if entry["event"] == "pubsub.event_dropped"]
    assert len(failed) == 1
    assert failed[0]["attempt"] == 1
    assert dropped == [
        {
            "event": "pubsub.event_dropped",
            "log_level": "warning",
            "topic": "t",
            "group": group,
            "event_id": poison.id,
            "attempts": 2,
            "error": "RuntimeError(\"handler failure on 'poison' #2\")",
        }
    ]


async def test_nothing_dropped_when_handlers_succeed() -> None:
    got = Recorder()
    with structlog.testing.capture_logs() as logs:
        async with InMemoryPubSub() as ps:
            await ps.subscribe("t", got)
            await ps.publish("t", Event("e", 1))
            await _until(lambda: got.data == [1])
    assert [entry for entry in logs if entry["log_level"] == "warning"] == []


async def test_extension_is_one_object_per_name_and_instance() -> None:
    first, second = InMemoryPubSub(), InMemoryPubSub()
    built: list[str] = []

    def factory(name: str) -> Callable[[], dict[str, str]]:
        def build() -> dict[str, str]:
            built.append(name)
            return {"name": name}

        return build

    store = first.extension("signals.store", factory("a"))
    assert first.extension("signals.store", factory("b")) is store
    assert first.extension("other", factory("c")) is not store
    assert second.extension("signals.store", factory("d")) is not store
    assert built == ["a", "c", "d"], "a factory runs once per name and instance"
    with pytest.raises(TypeError, match="name"):
        first.extension(1, factory("e"))  # type: ignore[arg-type]


async def test_it_owns_one_in_memory_lease_provider() -> None:
    ps = InMemoryPubSub()
    provider = ps.get_lease_provider()
    assert isinstance(provider, leases.InMemoryLeaseProvider)
    assert ps.get_lease_provider() is provider
    assert leases.resolve_lease_provider(ps) is provider
    assert leases.is_lease_provider(ps)  # a first-party pub/sub is its own provider
    assert InMemoryPubSub().get_lease_provider() is not provider
    first = await provider.acquire_lease("thread", "runtime-a", 5000)
    second = await leases.resolve_lease_provider(ps).acquire_lease("thread", "runtime-b", 5000)
    assert first.acquired and not second.acquired and second.owner == "runtime-a"
    third = await ps.acquire_lease("thread", "runtime-c", 5000)  # the same leases, through it
    assert not third.acquired and third.owner == "runtime-a"
    assert await ps.get_lease_owner("thread") == "runtime-a"
