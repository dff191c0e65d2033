"""What :class:`~signals.kit.KitStore` derives when a core lacks a capability.

* :class:`PubSubNotices`: notices over the pub/sub. A runtime subscribes to its own topic
  (``<prefix>.notice.<runtime id>``) and, as a worker, to ``<prefix>.work``: two subscriptions
  per process, whatever the number of threads. Notices are hints (the inbox is the durable
  state): a lost one costs at most a recovery pass.
* :class:`LeaseRegistry`: a runtime's presence is a lease on ``~runtime:<id>`` held by the
  runtime's heartbeat (free with lease sessions), whose owner is the runtime's info as JSON.
  It cannot list every runtime, nor the threads a runtime owns: :meth:`runtimes` and
  :meth:`runtime_threads` know only what was looked up.
* :class:`PubSubStreams`: parts over the pub/sub, one topic per thread
  (``<prefix>.stream.<thread>``), live only: a reader sees the parts written while it follows,
  a cursor is an event id, and nothing is kept to read back (``stream_read`` returns nothing,
  ``stream(after=...)`` resumes only parts still to come).
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from _signal_leases.aio import unix_now
from pubsub import Event
from signals._model import StreamPart
from signals.kit._capabilities import Notice, PartIn, RuntimeInfo
from signals.kit._core import InboxEntry, decode_entry

if TYPE_CHECKING:
    from leases import LeaseProvider
    from pubsub import PubSub

__all__ = [
    "TOPIC_PREFIX",
    "LeaseRegistry", "LocalNotices", "PubSubNotices", "PubSubStreams", "notice_data", "notice_of",
]


#: The topic prefix of the notices and streams derived over a pub/sub.
TOPIC_PREFIX = "signals"


def notice_data(notice: Notice) -> dict[str, Any]:
    """A notice as JSON data (an entry it carries goes with it)."""
    data: dict[str, Any] = {"k": notice.kind, "t": notice.thread_key}
    if notice.run_id is not None:
        data["r"] = notice.run_id
    if notice.reason is not None:
        data["why"] = notice.reason
    e = notice.entry
    if e is not None:
        data["e"] = {"id": e.entry_id, "s": e.signal.encode(), "m": e.mode, "n": e.attempts}
    return data


def notice_of(data: dict[str, Any]) -> Notice:
    """Inverse of :func:`notice_data`."""
    entry: InboxEntry | None = None
    raw = data.get("e")
    if isinstance(raw, dict):
        entry = decode_entry(str(raw["id"]), raw["s"], raw.get("m", "deliver"), int(raw["n"]),
                             state="carried", holder=data.get("r"))
    return Notice(data["k"], data.get("t", ""), data.get("r"), data.get("why"), entry)


class PubSubNotices:
    """Notices over a pub/sub (see the module docstring)."""

    def __init__(self, pubsub: PubSub, prefix: str) -> None:
        self._pubsub = pubsub
        self._prefix = prefix

    def _topic(self, runtime_id: str | None) -> str:
        return f"{self._prefix}.work" if runtime_id is None else \
            f"{self._prefix}.notice.{runtime_id}"

    async def notify(self, runtime_id: str | None, notice: Notice) -> None:
        await self._pubsub.publish(self._topic(runtime_id),
                                   Event("signals.notice", notice_data(notice)))

    def stager(self, database: object) -> Callable[[Any, str | None, Notice], str] | None:
        """When the pub/sub keeps its events in ``database`` and can publish inside one of
        its transactions (``publish_in``, as ``SQLPubSub``): ``stage(tx, runtime_id,
        notice) -> topic``, which writes the notice in the caller's transaction (then call
        :meth:`announce` with the topics after the commit). ``None`` otherwise."""
        publish_in = getattr(self._pubsub, "publish_in", None)
        if publish_in is None or getattr(self._pubsub, "sql_database", None) is not database:
            return None

        def stage(tx: Any, runtime_id: str | None, notice: Notice) -> str:
            topic = self._topic(runtime_id)
            publish_in(tx, topic, Event("signals.notice", notice_data(notice)))
            return topic

        return stage

    def sql_notices(self, database: object) -> tuple[str, str] | None:
        """``(topic prefix of a runtime's notices, NOTIFY channel)`` when a statement of the
        core in ``database`` may publish a notice by SQL of its own: the pub/sub keeps its
        events there and rings by ``NOTIFY`` (``SQLPubSub.notify_channel``). ``None``
        otherwise."""
        channel_of = getattr(self._pubsub, "notify_channel", None)
        if channel_of is None or getattr(self._pubsub, "sql_database", None) is not database:
            return None
        channel = channel_of()
        return None if channel is None else (f"{self._prefix}.notice.", channel)

    async def announce(self, topics: Collection[str]) -> None:
        """Wake the readers of ``topics`` after the transaction that staged them committed."""
        await self._pubsub.announce(topics)  # type: ignore[attr-defined]

    @asynccontextmanager
    async def listen(self, runtime_id: str, handler: Callable[[Notice], None], *, worker: bool
                     ) -> AsyncIterator[None]:
        async def on_event(event: Event) -> None:
            if isinstance(event.data, dict) and "k" in event.data:
                handler(notice_of(event.data))

        async with AsyncExitStack() as stack:
            for topic in [self._topic(runtime_id)] + ([self._topic(None)] if worker else []):
                sub = await self._pubsub.subscribe(topic, on_event)
                stack.push_async_callback(sub.close)
            handler(Notice("resync"))
            yield


class LocalNotices:
    """Notices between the runtimes of this process only (a core used without a pub/sub)."""

    def __init__(self) -> None:
        self._handlers: dict[str, Callable[[Notice], None]] = {}
        self._workers: set[str] = set()

    async def notify(self, runtime_id: str | None, notice: Notice) -> None:
        for rid in list(self._workers if runtime_id is None else [runtime_id]):
            handler = self._handlers.get(rid)
            if handler is not None:
                handler(notice)

    @asynccontextmanager
    async def listen(self, runtime_id: str, handler: Callable[[Notice], None], *, worker: bool
                     ) -> AsyncIterator[None]:
        self._handlers[runtime_id] = handler
        if worker:
            self._workers.add(runtime_id)
        try:
            handler(Notice("resync"))
            yield
        finally:
            self._handlers.pop(runtime_id, None)
            self._workers.discard(runtime_id)


class LeaseRegistry:
    """A runtime registry over the lease provider (see the module docstring)."""

    def __init__(self, leases: LeaseProvider) -> None:
        self._leases = leases
        self._known: dict[str, RuntimeInfo] = {}

    @staticmethod
    def key(runtime_id: str) -> str:
        return f"~runtime:{runtime_id}"

    @staticmethod
    def owner(info: RuntimeInfo) -> str:
        return json.dumps({"h": info.host, "p": info.pid, "s": info.started_at,
                           "w": info.worker}, separators=(",", ":"))

    async def register_runtime(self, info: RuntimeInfo, ttl_ms: int) -> None:
        self._known[info.runtime_id] = info
        await self._leases.acquire_lease(self.key(info.runtime_id), self.owner(info), ttl_ms)

    async def refresh_runtime(self, runtime_id: str, ttl_ms: int) -> bool:
        info = self._known.get(runtime_id)
        if info is None:
            return False
        return await self._leases.renew_lease(self.key(runtime_id), self.owner(info), ttl_ms)

    async def unregister_runtime(self, runtime_id: str) -> None:
        info = self._known.pop(runtime_id, None)
        if info is not None:
            await self._leases.release_lease(self.key(runtime_id), self.owner(info))

    async def track_threads(self, runtime_id: str, *, add: Sequence[str] = (),
                            remove: Sequence[str] = ()) -> None:
        """Nothing to keep: a thread's owner is its lease's owner."""

    async def lookup(self, runtime_id: str) -> RuntimeInfo | None:
        """The live runtime ``runtime_id``, from its presence lease."""
        raw = await self._leases.get_lease_owner(self.key(runtime_id))
        if raw is None:
            return None
        try:
            d = json.loads(raw)
            return RuntimeInfo(runtime_id, str(d["h"]), int(d["p"]), float(d["s"]), bool(d["w"]))
        except (ValueError, KeyError, TypeError):
            return None

    async def runtimes(self) -> list[RuntimeInfo]:
        out = []
        for runtime_id in list(self._known):
            found = await self.lookup(runtime_id)
            out.append(found or RuntimeInfo(runtime_id, socket.gethostname(), os.getpid(), 0.0,
                                            True, alive=False))
        return out

    async def runtime_threads(self, runtime_id: str) -> list[str]:
        return []


class PubSubStreams:
    """Output streams over a pub/sub, live only (see the module docstring)."""

    def __init__(self, pubsub: PubSub, prefix: str) -> None:
        self._pubsub = pubsub
        self._prefix = prefix

    def _topic(self, thread_key: str) -> str:
        return f"{self._prefix}.stream.{thread_key}"

    async def emit(self, thread_key: str, parts: Sequence[PartIn]) -> list[str]:
        cursors = []
        for p in parts:
            data = {"k": p.kind, "r": p.run_id, "s": p.signal_id, "at": unix_now(),
                    "d": json.loads(p.data) if p.data else None}
            cursors.append(await self._pubsub.publish(self._topic(thread_key),
                                                      Event("signals.part", data)))
        return cursors

    async def stream_read(self, thread_key: str, *, after: str | None = None,
                          limit: int = 100) -> list[StreamPart]:
        return []

    async def stream_tail(self, thread_key: str) -> str | None:
        return None

    @asynccontextmanager
    async def follower(self) -> AsyncIterator[PubSubStreams]:
        yield self

    async def wait(self, thread_key: str, after: str | None) -> list[StreamPart]:
        """Subscribe to the thread's topic until a part arrives (while someone waits)."""
        got: list[StreamPart] = []
        arrived = anyio.Event()

        async def on_event(event: Event) -> None:
            d = event.data if isinstance(event.data, dict) else {}
            got.append(StreamPart(event.id, thread_key, d.get("r") or None, d.get("k", "part"),
                                  d.get("d"), d.get("s"), d.get("at")))
            arrived.set()

        sub = await self._pubsub.subscribe(self._topic(thread_key), on_event)
        try:
            await arrived.wait()
            await anyio.lowlevel.checkpoint()  # let a burst arrive together
        finally:
            await sub.close()
        return got
