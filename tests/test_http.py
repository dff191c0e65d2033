"""``signals.http`` under a real uvicorn, on a real loopback port, with a real HTTP client.

Each test runs, on its own asyncio loop: a ``RedisStreamsPubSub`` on the suite's redis-server,
a worker ``SignalRuntime`` with a fake agent, a sender-only runtime for the app (the usual
front end), and ``uvicorn.Server`` serving ``create_app`` in the same task group; ``httpx``
talks to it over TCP. Redis-less checks (the loopback rules) are plain unit tests.
"""

from __future__ import annotations

import gc
import json
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import pytest
import redis.asyncio
import uvicorn
from starlette.requests import Request

from pubsub import RedisStreamsPubSub
from signals import RedisSignalStore, Run, SignalRuntime
from signals.http import Action, SignalsApp, create_app
from signals.http._auth import is_loopback_host, is_loopback_ip
from signals.kit import PartIn
from tests._redis_server import RedisServer

# -- the fake agent ------------------------------------------------------------------------


async def fake_agent(run: Run) -> None:
    """Emit ``tokens`` tokens (``delay`` s apart), then ack with the whole text."""
    async for signal in run:
        spec = signal.payload if isinstance(signal.payload, dict) else {}
        words = [f"w{i}" for i in range(int(spec.get("tokens", 3)))]
        pad = "x" * int(spec.get("pad", 0))
        for word in words:
            await run.emit({"token": word, "pad": pad}, signal=signal)
            await anyio.sleep(float(spec.get("delay", 0)))
        await run.ack(signal, result={"text": " ".join(words)})


# -- a real server on a free loopback port --------------------------------------------------


@asynccontextmanager
async def serve(app: Any) -> AsyncIterator[str]:
    """Run ``app`` under uvicorn in this task group; yield its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_config=None, access_log=False, lifespan="off",
        ws="none", http="h11", timeout_graceful_shutdown=2,
    )
    server = uvicorn.Server(config)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, [sock])
            with anyio.fail_after(10):
                while not server.started:  # noqa: ASYNC110 (uvicorn sets a flag, no event)
                    await anyio.sleep(0.01)
            try:
                yield f"http://127.0.0.1:{port}"
            finally:
                server.should_exit = True
    finally:
        sock.close()


@dataclass
class Kit:
    url: str
    client: httpx.AsyncClient
    app: SignalsApp
    front: SignalRuntime
    pubsub: RedisStreamsPubSub
    streams: list[int] = field(default_factory=lambda: [0])  # live follow iterators


@asynccontextmanager
async def stack(
    redis_url: str,
    prefix: str,
    *,
    worker: bool = True,
    front_options: dict[str, Any] | None = None,
    app_options: dict[str, Any] | None = None,
) -> AsyncIterator[Kit]:
    """Pub/sub, an optional worker, the front runtime, the app under uvicorn, a client."""
    async with AsyncExitStack() as stack:
        pubsub = await stack.enter_async_context(
            RedisStreamsPubSub(url=redis_url, key_prefix=prefix)
        )
        if worker:
            await stack.enter_async_context(
                SignalRuntime(pubsub=pubsub, agent=fake_agent, shutdown_timeout_ms=0)
            )
        front = await stack.enter_async_context(
            SignalRuntime(pubsub=pubsub, agent=None, **(front_options or {}))
        )
        streams = [0]
        _count_streams(front, streams)
        app = create_app(front, **(app_options or {}))
        url = await stack.enter_async_context(serve(app))
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=20))
        yield Kit(url, client, app, front, pubsub, streams)


def _count_streams(runtime: SignalRuntime, live: list[int]) -> None:
    """Wrap ``runtime.stream`` so the test sees how many following iterators are alive."""
    real = runtime.stream

    def stream(thread_key: str, *, after: str | None = None, follow: bool = True) -> Any:
        if not follow:
            return real(thread_key, after=after, follow=False)

        async def counted() -> AsyncIterator[Any]:
            live[0] += 1
            try:
                async for part in real(thread_key, after=after, follow=True):
                    yield part
            finally:
                live[0] -= 1

        return counted()

    runtime.stream = stream  # type: ignore[method-assign]


# -- SSE on the client side -----------------------------------------------------------------


@dataclass
class Event:
    id: str | None
    event: str
    data: Any


async def events(response: httpx.Response, comments: list[str] | None = None) -> AsyncIterator[
    Event
]:
    """Parse a text/event-stream body into events (comments go to ``comments``)."""
    fields: dict[str, str] = {}
    async for line in response.aiter_lines():
        if not line:
            if "data" in fields:
                yield Event(fields.get("id"), fields.get("event", "message"),
                            json.loads(fields["data"]))
            fields = {}
        elif line.startswith(":"):
            if comments is not None:
                comments.append(line)
        else:
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")


async def collect(
    source: AsyncIterator[Event], until: Callable[[Event], bool], limit: float = 15
) -> list[Event]:
    """Events from ``source`` (one ``events(response)`` per response) up to ``until``."""
    out: list[Event] = []
    with anyio.fail_after(limit):
        async for event in source:
            out.append(event)
            if until(event):
                break
    return out


def error_of(response: httpx.Response) -> str:
    body = response.json()
    assert set(body) == {"error", "message"}, body
    assert "Traceback" not in response.text
    return str(body["error"])


# -- sending, receipts, the thread ----------------------------------------------------------


@pytest.mark.redis
@pytest.mark.anyio
async def test_send_waits_for_the_processed_receipt(redis_url: str, key_prefix: str) -> None:
    async with stack(redis_url, key_prefix) as kit:
        r = await kit.client.post("/threads/chat/signals?wait=10",
                                  json={"payload": {"tokens": 3}, "id": "m1", "type": "user"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["outcome"] == "queued" and body["signal_id"] == "m1"
        assert body["thread_key"] == "chat" and body["duplicate"] is False
        assert body["backpressure"] is False and "owner" in body and "run_id" in body
        assert body["receipt"]["status"] == "processed" and body["receipt"]["done"] is True
        assert body["receipt"]["result"] == {"text": "w0 w1 w2"}

        again = (await kit.client.post("/threads/chat/signals", json={"payload": 1, "id": "m1"}))
        assert again.json()["duplicate"] is True and again.json()["outcome"] == "discarded"
        assert again.json()["receipt"]["status"] == "processed"

        receipt = await kit.client.get("/threads/chat/signals/m1")
        assert receipt.status_code == 200 and receipt.json()["status"] == "processed"
        assert receipt.json()["signal_id"] == "m1"
        missing = await kit.client.get("/threads/chat/signals/nope")
        assert missing.status_code == 404 and error_of(missing) == "unknown_signal"
        waited = await kit.client.get("/threads/chat/signals/nope?wait=0.1")
        assert waited.status_code == 404 and error_of(waited) == "unknown_signal"

        # a thread key with "/" travels as %2F and stays one key
        slash = await kit.client.post("/threads/user%2F7/signals?wait=10", json={"payload": None})
        assert slash.json()["thread_key"] == "user/7", slash.text
        assert slash.json()["receipt"]["status"] == "processed"
        info = await kit.client.get("/threads/user%2F7")
        assert info.json()["thread"]["thread_key"] == "user/7"


@pytest.mark.redis
@pytest.mark.anyio
async def test_get_thread_shows_the_owner_and_the_pending_signals(
    redis_url: str, key_prefix: str
) -> None:
    async with stack(redis_url, key_prefix) as kit:
        await kit.client.post("/threads/t/signals",
                              json={"payload": {"tokens": 200, "delay": 0.02}, "id": "long"})
        for n in range(2):
            await kit.client.post("/threads/t/signals",
                                  json={"payload": n, "id": f"q{n}", "if_active": "queue"})
        with anyio.fail_after(10):
            while True:
                body = (await kit.client.get("/threads/t")).json()
                if body["thread"]["owner"] is not None:
                    break
                await anyio.sleep(0.02)
        thread = body["thread"]
        assert thread["thread_key"] == "t" and thread["runtime_id"] and thread["pid"]
        assert thread["pending"] == 3 and thread["last_activity"] is not None
        assert [p["id"] for p in body["pending"]] == ["long", "q0", "q1"]
        assert body["pending"][1]["mode"] == "queue" and body["pending"][1]["attempt"] == 0
        assert body["pending"][0]["attempt"] == 1 and body["pending_truncated"] is False
        short = (await kit.client.get("/threads/t?limit=1")).json()
        assert len(short["pending"]) == 1 and short["pending_truncated"] is True
        await kit.client.post("/threads/t/abort", json={"clear_pending": True})
        idle = (await kit.client.get("/threads/unknown")).json()
        assert idle["thread"]["owner"] is None and idle["pending"] == []


# -- the event stream -----------------------------------------------------------------------


@pytest.mark.redis
@pytest.mark.anyio
async def test_stream_resumes_after_a_dropped_connection_with_no_gap_and_no_repeat(
    redis_url: str, key_prefix: str
) -> None:
    async with stack(redis_url, key_prefix) as kit:
        await kit.client.post("/threads/c/signals",
                              json={"payload": {"tokens": 30, "delay": 0.02}, "id": "q"})
        async with kit.client.stream("GET", "/threads/c/stream") as first:
            assert first.status_code == 200
            assert first.headers["content-type"].startswith("text/event-stream")
            seen = await collect(events(first), lambda e: e.event == "part" and e.data["data"]
                                 ["token"] == "w4")
        # the client hung up: its iterator on the server stops
        with anyio.fail_after(5):
            while kit.streams[0]:
                gc.collect()
                await anyio.sleep(0.02)
        await anyio.sleep(0.2)  # parts written while nobody listens
        last = seen[-1].id
        assert last is not None
        async with kit.client.stream("GET", "/threads/c/stream",
                                     headers={"Last-Event-ID": last}) as second:
            rest = await collect(events(second), lambda e: e.event == "run.finished")
        everything = await kit.client.get("/threads/c/stream?follow=false")
        assert everything.headers["content-type"].startswith("text/event-stream")
        full = [e async for e in events(everything)]
        ids = [e.id for e in seen + rest]
        assert ids == [e.id for e in full], "a gap or a repeat across the reconnect"
        assert len(set(ids)) == len(ids)
        tokens = [e.data["data"]["token"] for e in seen + rest if e.event == "part"]
        assert tokens == [f"w{i}" for i in range(30)]
        part = rest[0].data
        assert set(part) == {"cursor", "thread_key", "run_id", "kind", "data", "signal_id", "at"}
        assert part["cursor"] == rest[0].id and part["thread_key"] == "c"
        # ?after= works the same (the header wins when both are given)
        middle = full[len(full) // 2].id
        assert middle is not None
        by_query = await kit.client.get(f"/threads/c/stream?follow=false&after={middle}")
        by_header = await kit.client.get("/threads/c/stream?follow=false&after=0-1",
                                         headers={"Last-Event-ID": middle})
        expected = [e.id for e in full[len(full) // 2 + 1:]]
        assert [e.id async for e in events(by_query)] == expected
        assert [e.id async for e in events(by_header)] == expected


@pytest.mark.redis
@pytest.mark.anyio
async def test_a_slow_client_never_holds_the_run_back(redis_url: str, key_prefix: str) -> None:
    async with stack(redis_url, key_prefix) as kit:
        async with kit.client.stream("GET", "/threads/s/stream") as stalled:
            assert stalled.status_code == 200
            # ~3 MB of parts while this client reads nothing at all
            r = await kit.client.post("/threads/s/signals?wait=30",
                                      json={"payload": {"tokens": 400, "pad": 8000}, "id": "q"})
            assert r.json()["receipt"]["status"] == "processed", r.text
            tokens = [e.data["data"]["token"]
                      for e in await collect(events(stalled), lambda e: e.event == "run.finished")
                      if e.event == "part"]
        assert tokens == [f"w{i}" for i in range(400)]


@pytest.mark.redis
@pytest.mark.anyio
async def test_idle_streams_get_heartbeats_and_follow_false_ends(
    redis_url: str, key_prefix: str
) -> None:
    async with stack(redis_url, key_prefix, app_options={"heartbeat": 0.1}) as kit:
        comments: list[str] = []
        async with kit.client.stream("GET", "/threads/quiet/stream") as r:
            with anyio.move_on_after(0.5):
                async for _ in events(r, comments):
                    pass
        assert comments.count(": keep-alive") >= 2, comments
        with anyio.fail_after(5):
            r = await kit.client.get("/threads/quiet/stream?follow=false")
        assert r.status_code == 200 and "retry:" in r.text and "event:" not in r.text
        bad = await kit.client.get("/threads/quiet/stream?follow=maybe")
        assert bad.status_code == 400 and error_of(bad) == "bad_request"


@pytest.mark.redis
@pytest.mark.anyio
async def test_close_streams_ends_open_streams_for_a_shutdown(
    redis_url: str, key_prefix: str
) -> None:
    async with stack(redis_url, key_prefix, worker=False) as kit:
        async with kit.client.stream("GET", "/threads/z/stream") as r:
            lines = r.aiter_lines()
            assert await anext(lines) == "retry: 2000"
            kit.app.close_streams()
            with anyio.fail_after(5):
                rest = [line async for line in lines]  # the response ends, without an error
        assert rest == [""]
        with anyio.fail_after(5):
            while kit.streams[0]:
                gc.collect()
                await anyio.sleep(0.02)
        again = await kit.client.get("/threads/z/stream")
        assert again.status_code == 503 and error_of(again) == "shutting_down"
        assert (await kit.client.get("/threads/z")).status_code == 200  # the rest still works


@pytest.mark.redis
@pytest.mark.anyio
async def test_an_expired_cursor_is_410(redis_url: str, key_prefix: str) -> None:
    store = RedisSignalStore(url=redis_url, key_prefix=f"{key_prefix}:small", stream_max_parts=3)
    try:
        parts = [PartIn("part", "r/1", None, json.dumps(i)) for i in range(6)]
        cursors = await store.emit("x", parts)
        async with RedisStreamsPubSub(url=redis_url, key_prefix=key_prefix) as pubsub, \
                SignalRuntime(pubsub=pubsub, agent=None, inbox=store) as front, \
                serve(create_app(front)) as url, httpx.AsyncClient(base_url=url) as client:
            r = await client.get("/threads/x/stream", headers={"Last-Event-ID": cursors[0]})
            assert r.status_code == 410 and error_of(r) == "cursor_expired"
            ok = await client.get(f"/threads/x/stream?follow=false&after={cursors[3]}")
            assert [e.data["data"] async for e in events(ok)] == [4, 5]
            everything = await client.get("/threads/x/stream?follow=false")
            assert [e.data["data"] async for e in events(everything)] == [3, 4, 5]
    finally:
        await store.aclose()


# -- control: abort and cancel --------------------------------------------------------------


@pytest.mark.redis
@pytest.mark.anyio
async def test_abort_of_a_long_run_shows_run_cancelled_in_the_stream(
    redis_url: str, key_prefix: str
) -> None:
    async with stack(redis_url, key_prefix) as kit:
        await kit.client.post("/threads/a/signals",
                              json={"payload": {"tokens": 1000, "delay": 0.02}, "id": "long"})
        async with kit.client.stream("GET", "/threads/a/stream") as r:
            stream = events(r)
            got = await collect(stream, lambda e: e.event == "part")
            run_id = got[-1].data["run_id"]
            stop = await kit.client.post("/threads/a/abort", json={
                "run_id": run_id, "clear_pending": True, "reason": "user pressed stop"})
            assert stop.status_code == 200 and stop.json() == {"aborted": True}
            tail = await collect(stream, lambda e: e.event == "run.cancelled")
        assert tail[-1].data["data"] == {"reason": "abort: user pressed stop"}
        assert tail[-1].data["run_id"] == run_id
        receipt = (await kit.client.get("/threads/a/signals/long?wait=5")).json()
        assert receipt["status"] == "cancelled"
        again = await kit.client.post("/threads/a/abort")  # no body: nothing to abort now
        assert again.status_code == 200 and again.json() == {"aborted": False}
        bad = await kit.client.post("/threads/a/abort", json={"clear_pending": "yes"})
        assert bad.status_code == 400 and error_of(bad) == "bad_request"


@pytest.mark.redis
@pytest.mark.anyio
async def test_cancel_a_queued_signal_and_an_unknown_one(redis_url: str, key_prefix: str) -> None:
    async with stack(redis_url, key_prefix, worker=False) as kit:
        for n in range(2):
            r = await kit.client.post("/threads/q/signals",
                                      json={"payload": n, "id": f"s{n}", "if_idle": "enqueue"})
            assert r.json()["outcome"] == "queued"
        gone = await kit.client.delete("/threads/q/signals/s0")
        assert gone.status_code == 200 and gone.json() == {"signal_id": "s0", "cancelled": True}
        receipt = await kit.client.get("/threads/q/signals/s0")
        assert receipt.json()["status"] == "cancelled"
        twice = await kit.client.delete("/threads/q/signals/s0")
        assert twice.status_code == 404 and error_of(twice) == "not_pending"
        assert "cancelled" in twice.json()["message"]
        unknown = await kit.client.delete("/threads/q/signals/never")
        assert unknown.status_code == 404 and error_of(unknown) == "not_pending"
        assert [p["id"] for p in (await kit.client.get("/threads/q")).json()["pending"]] == ["s1"]


@pytest.mark.redis
@pytest.mark.anyio
async def test_pause_resume_and_dispositions_over_http(redis_url: str, key_prefix: str) -> None:
    async with stack(redis_url, key_prefix, worker=False,
                     front_options={"max_pending_per_thread": 3}) as kit:
        paused = await kit.client.post("/threads/p/pause")
        assert paused.json() == {"thread_key": "p", "paused": True, "was_paused": False}
        assert (await kit.client.get("/threads/p")).json()["thread"]["paused"] is True
        sent = [await kit.client.post("/threads/p/signals", json={
            "payload": n, "id": f"b{n}", "lane": "page", "merge": "supersede", "priority": 2})
            for n in range(2)]
        assert sent[1].json()["superseded"] == ["b0"]
        later = await kit.client.post("/threads/p/signals",
                                      json={"payload": 0, "id": "d", "delay_ms": 60_000})
        assert later.json()["outcome"] == "scheduled"
        await kit.client.post("/threads/p/signals", json={"payload": 0, "id": "c"})
        over = await kit.client.post("/threads/p/signals", json={"payload": 0, "id": "x"})
        assert over.json()["outcome"] == "rejected" and "3" in over.json()["reason"]
        pending = (await kit.client.get("/threads/p")).json()["pending"]
        assert [p["id"] for p in pending] == ["b1", "d", "c"]  # priority, then accept order
        bad = await kit.client.post("/threads/p/signals", json={"payload": 0, "priority": "hi"})
        assert bad.status_code == 400 and "priority" in bad.json()["message"]
        far = await kit.client.post("/threads/p/signals",
                                    json={"payload": 0, "expires_at": 1.7976931348623157e308})
        assert far.status_code == 400 and "expires_at" in far.json()["message"]
        resumed = await kit.client.post("/threads/p/resume")
        assert resumed.json() == {"thread_key": "p", "paused": False, "was_paused": True}
        assert (await kit.client.get("/threads/p")).json()["thread"]["paused"] is False
        wrong = await kit.client.get("/threads/p/pause")
        assert wrong.status_code == 405


@pytest.mark.redis
@pytest.mark.anyio
async def test_schedules_over_http(redis_url: str, key_prefix: str) -> None:
    async with stack(redis_url, key_prefix, worker=False) as kit:
        body = {"schedule_id": "digest", "thread_key": "inbox", "cron": "0 8 * * *",
                "tz": "Europe/Paris", "signal": {"payload": {"d": 1}, "type": "digest"}}
        made = await kit.client.post("/schedules", json=body)
        assert made.status_code == 200, made.text
        assert made.json()["schedule_id"] == "digest" and made.json()["next_at"] > 0
        assert made.json()["signal"] == {"payload": {"d": 1}, "type": "digest"}
        listed = (await kit.client.get("/schedules")).json()["schedules"]
        assert [(s["schedule_id"], s["cron"]) for s in listed] == [("digest", "0 8 * * *")]
        bad = await kit.client.post("/schedules", json={**body, "cron": "soon"})
        assert bad.status_code == 400 and "cron='soon'" in bad.json()["message"]
        odd = await kit.client.post("/schedules", json={**body, "when": 1})
        assert odd.status_code == 400 and "when" in odd.json()["message"]
        gone = await kit.client.delete("/schedules/digest")
        assert gone.json() == {"schedule_id": "digest", "removed": True}
        missing = await kit.client.delete("/schedules/digest")
        assert missing.status_code == 404 and error_of(missing) == "unknown_schedule"
        assert (await kit.client.get("/schedules")).json() == {"schedules": []}


# -- errors ---------------------------------------------------------------------------------


@pytest.mark.redis
@pytest.mark.anyio
async def test_request_errors_are_json_with_stable_codes(redis_url: str, key_prefix: str) -> None:
    options = {"max_signal_bytes": 1024}
    async with stack(redis_url, key_prefix, worker=False, front_options=options) as kit:
        c = kit.client
        url = "/threads/e/signals"
        cases: list[tuple[httpx.Response, int, str]] = [
            (await c.post(url, content=b"{nope", headers={"content-type": "application/json"}),
             400, "bad_json"),
            (await c.post(url, content=b"[" * 50_000,
                          headers={"content-type": "application/json"}), 400, "bad_json"),
            (await c.post(url, content=b'{"payload": NaN}',
                          headers={"content-type": "application/json"}), 400, "bad_json"),
            (await c.post(url, content=b'{"payload": 1}'), 415, "unsupported_media_type"),
            (await c.post(url, json=[1]), 400, "bad_request"),
            (await c.post(url, json={}), 400, "bad_request"),
            (await c.post(url, json={"payload": 1, "colour": "red"}), 400, "bad_request"),
            (await c.post(url, json={"payload": 1, "id": 7}), 400, "bad_request"),
            (await c.post(url, json={"payload": 1, "if_active": "shout"}), 400, "bad_request"),
            (await c.post(f"{url}?wait=-1", json={"payload": 1}), 400, "bad_request"),
            (await c.post(f"{url}?wait=1e9", json={"payload": 1}), 400, "bad_request"),
            (await c.post(url, json={"payload": "x" * 2000}), 413, "too_large"),
            (await c.post(url, json={"payload": "x" * 200_000}), 413, "too_large"),
            (await c.post("/threads/%FF/signals", json={"payload": 1}), 400, "bad_request"),
            (await c.post("/threads/a%01b/signals", json={"payload": 1}), 400, "bad_request"),
            (await c.get("/nowhere"), 404, "not_found"),
            (await c.get("/threads/e/signals/a/b"), 404, "not_found"),
            (await c.put(url, json={"payload": 1}), 405, "method_not_allowed"),
            (await c.get("/threads/e/stream?after=not-a-cursor"), 400, "bad_request"),
        ]
        for response, status, code in cases:
            assert (response.status_code, error_of(response)) == (status, code), (
                response.request.method, response.request.url, response.text)
        put = await c.put(url, json={"payload": 1})
        assert put.headers["allow"] == "POST"
        assert (await c.get("/threads/e")).json()["pending"] == []  # nothing was stored


@pytest.mark.redis
@pytest.mark.anyio
async def test_backend_down_is_503_and_backend_refusal_is_502(
    private_redis_server: RedisServer, key_prefix: str
) -> None:
    admin = redis.asyncio.Redis.from_url(private_redis_server.url)
    try:
        async with stack(private_redis_server.url, key_prefix, worker=False) as kit:
            await admin.execute_command(  # type: ignore[no-untyped-call]
                "ACL", "SETUSER", "default", "-@scripting")
            refused = await kit.client.post("/threads/b/signals", json={"payload": 1})
            assert refused.status_code == 502 and error_of(refused) == "backend_error"
            await admin.execute_command(  # type: ignore[no-untyped-call]
                "ACL", "SETUSER", "default", "+@all")
            private_redis_server.stop()
            try:
                for response in (
                    await kit.client.post("/threads/b/signals", json={"payload": 1}),
                    await kit.client.get("/threads/b"),
                    await kit.client.get("/threads/b/signals/x"),
                    await kit.client.get("/threads/b/stream"),
                ):
                    assert response.status_code == 503, response.text
                    assert error_of(response) == "backend_unavailable"
                    assert response.headers["retry-after"] == "1"
            finally:
                private_redis_server.start()
            ok = await kit.client.post("/threads/b/signals", json={"payload": 1})
            assert ok.status_code == 200, ok.text
    finally:
        await admin.aclose()


# -- who may call -----------------------------------------------------------------------------


@pytest.mark.redis
@pytest.mark.anyio
async def test_default_serves_this_machine_only(redis_url: str, key_prefix: str) -> None:
    async with stack(redis_url, key_prefix, worker=False) as kit:
        c = kit.client
        send = {"payload": 1, "if_idle": "enqueue"}
        assert (await c.post("/threads/l/signals", json=send)).status_code == 200
        # uvicorn trusts X-Forwarded-For from 127.0.0.1: a proxied remote client
        remote = await c.post("/threads/l/signals", json=send,
                              headers={"X-Forwarded-For": "203.0.113.7"})
        assert remote.status_code == 403 and error_of(remote) == "forbidden"
        assert "203.0.113.7" in remote.json()["message"]
        rebound = await c.get("/threads/l", headers={"Host": "evil.example:80"})
        assert rebound.status_code == 403 and error_of(rebound) == "forbidden"
        foreign = await c.post("/threads/l/abort", headers={"Origin": "https://evil.example"})
        assert foreign.status_code == 403 and error_of(foreign) == "forbidden"
        own = await c.post("/threads/l/abort", headers={"Origin": kit.url})
        assert own.status_code == 200
    async with stack(redis_url, key_prefix, worker=False,
                     app_options={"allow_remote": True}) as kit:
        remote = await kit.client.post("/threads/l/signals", json=send,
                                       headers={"X-Forwarded-For": "203.0.113.7"})
        assert remote.status_code == 200


@pytest.mark.redis
@pytest.mark.anyio
async def test_the_authorize_hook_decides_with_401_and_403(
    redis_url: str, key_prefix: str
) -> None:
    calls: list[tuple[str, Action]] = []

    async def authorize(request: Request, thread_key: str, action: Action) -> bool:
        calls.append((thread_key, action))
        token = request.headers.get("authorization")
        if token is None:
            raise PermissionError("a bearer token is required")
        if token == "Bearer boom":
            raise RuntimeError("a bug in the hook")
        return token == "Bearer good" or (token == "Bearer reader" and action == "read")

    async with stack(redis_url, key_prefix, app_options={"authorize": authorize}) as kit:
        c = kit.client
        missing = await c.get("/threads/h")
        assert missing.status_code == 401 and error_of(missing) == "unauthorized"
        assert missing.json()["message"] == "a bearer token is required"
        denied = await c.post("/threads/h/signals", json={"payload": 1},
                              headers={"Authorization": "Bearer reader"})
        assert denied.status_code == 403 and error_of(denied) == "forbidden"
        read = await c.get("/threads/h", headers={"Authorization": "Bearer reader"})
        assert read.status_code == 200
        # a hook that fails is a JSON 500, with no detail and no traceback
        broken = await c.get("/threads/h", headers={"Authorization": "Bearer boom"})
        assert broken.status_code == 500 and error_of(broken) == "internal_error"
        assert "a bug in the hook" not in broken.text
        # the hook replaces the loopback rule: a proxied remote client with a token is served
        good = {"Authorization": "Bearer good", "X-Forwarded-For": "203.0.113.7"}
        calls.clear()
        await c.post("/threads/h/signals?wait=5", json={"payload": 1, "id": "s"}, headers=good)
        await c.get("/threads/h/signals/s", headers=good)
        await c.delete("/threads/h/signals/s", headers=good)
        await c.post("/threads/h/abort", headers=good)
        await c.get("/threads/h/stream?follow=false", headers=good)
        assert calls == [("h", "send"), ("h", "read"), ("h", "cancel"), ("h", "abort"),
                         ("h", "stream")]


def test_loopback_rules() -> None:
    for host in ("127.0.0.1", "127.9.9.9", "::1", "[::1]", "::ffff:127.0.0.1"):
        assert is_loopback_ip(host), host
    for other in (None, "", "10.0.0.1", "203.0.113.7", "::ffff:10.0.0.1", "testclient", "::"):
        assert not is_loopback_ip(other), other
    for value in ("localhost", "localhost:8000", "LOCALHOST", "127.0.0.1:80", "[::1]:8000",
                  "app.localhost:1"):
        assert is_loopback_host(value), value
    for value in ("evil.example", "evil.example:8000", "10.0.0.1:80", "[::2]:80",
                  "localhost.evil.example"):
        assert not is_loopback_host(value), value


def test_create_app_checks_its_arguments() -> None:
    runtime: Any = type("R", (), {"max_signal_bytes": 1024})()
    with pytest.raises(TypeError):
        create_app(runtime, authorize="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        create_app(runtime, allow_remote=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        create_app(runtime, heartbeat=0)
