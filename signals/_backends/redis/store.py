"""``RedisSignalStore``: the durable core on Redis (accepted signals survive any crash).

Key layout: ``_signal_leases.keys.SignalKeys``; scripts: :mod:`signals._backends.redis.lua`
(one script, one round trip, per core call). It has every optional capability: notices are
Redis pub/sub messages published from inside the scripts, on ``<prefix>:notice:<runtime
id>`` and ``<prefix>:work``; the runtime registry and the pending index are in ``presence``;
output streams and their follower in ``output``; and with the ``RedisLeaseProvider`` of the
same Redis, the fused calls (a routed signal costs two round trips: route, then ack).

On a Cluster the cross-thread index (another slot) is updated in a separate call after the
per-thread script, in a crash-safe order (see ``lua``'s module docstring).

One method per core call, each a thin wrapper around one script; the client, the key layout
and how a script is called are in ``inbox`` (shared with the sender).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Unpack

from _signal_leases.redis.support import as_int, text
from signals._backends.redis.fused import RedisFused
from signals._backends.redis.inbox import InboxOptions
from signals._backends.redis.output import RedisOutput
from signals._backends.redis.presence import RedisPresence
from signals._model import EntryMode, Signal
from signals.kit._capabilities import CARRY_LIMIT
from signals.kit._core import (
    NO_LIMITS,
    Accepted,
    Ack,
    DeadLetter,
    InboxEntry,
    Limits,
    RunRef,
    Taken,
    ThreadState,
    decode_entry,
)

if TYPE_CHECKING:
    import redis.asyncio

    from leases import LeaseProvider

__all__ = ["RedisSignalStore"]


class RedisSignalStore(RedisOutput, RedisPresence, RedisFused):
    """A durable :class:`~signals.kit.SignalCore` on Redis, with every capability.

    Give exactly one of ``url`` or ``client`` (only a client built from ``url`` is closed by
    :meth:`aclose`); the client options ``cluster``, ``socket_timeout`` (2 s),
    ``max_connections`` (32), ``wait_replicas`` and ``wait_timeout_ms`` are those of every
    Redis backend. ``leases``: the ``RedisLeaseProvider`` on the same Redis whose leases the
    fused calls read and grant (the runtime passes the one of its ``RedisStreamsPubSub``).
    ``retention_ms`` / ``max_receipts``: receipts (and the dedup window) per thread;
    ``idle_ttl_ms``: a thread nobody sends to for this long is dropped by Redis.
    ``stream_max_parts`` / ``stream_retention_ms``: what each thread's output stream keeps
    (default 10,000 parts, 24 h).

    ``wait_replicas=N`` (default 0: off) follows every scripted write with ``WAIT N
    wait_timeout_ms`` on the same connection, and raises :class:`BackendUnavailableError`
    when fewer replicas acknowledged in time (the write may still have been applied: resend
    with the same signal id). See docs/cluster.md.
    """

    def __init__(
        self,
        *,
        url: str | None = None,
        client: redis.asyncio.Redis | None = None,
        key_prefix: str = "signals",
        leases: LeaseProvider | None = None,
        **options: Unpack[InboxOptions],
    ) -> None:
        super().__init__("RedisSignalStore", url=url, client=client, key_prefix=key_prefix,
                         lease_keys=None, **options)
        self.leases = leases

    @property
    def leases(self) -> LeaseProvider | None:
        """The ``RedisLeaseProvider`` whose leases the fused calls read and grant (its key
        layout is in every script's keys)."""
        return self._leases

    @leases.setter
    def leases(self, leases: LeaseProvider | None) -> None:
        self._leases = leases
        self._use_lease_keys(getattr(leases, "keys", None))

    # -- the core ---------------------------------------------------------------------------

    async def accept(
        self, thread_key: str, signal: Signal, mode: EntryMode, *, limits: Limits = NO_LIMITS
    ) -> Accepted:
        args = [*self._accept_args(signal, mode, limits), "0", "", 0, "", "", "", "", "0",
                CARRY_LIMIT]
        reply = await self._run("accept", thread_key, args, f"send to thread {thread_key!r}")
        accepted, _ = self._accepted(signal, reply)
        if self._idx == "0" and accepted.outcome == "duplicate" and accepted.receipt is not None \
                and accepted.receipt.status in ("pending", "scheduled"):
            await self._apply_index(thread_key, "a", time.time() * 1000)  # see _redo_index
        return accepted

    async def take(
        self, thread_key: str, run: RunRef, *, acks: Sequence[Ack] = (), max_attempts: int,
        first: bool = False,
    ) -> Taken:
        args: list[Any] = [run.run_id, "" if run.token is None else run.token, max_attempts,
                           "1" if first else "0"]
        for a in acks:
            args += [a.entry_id, a.signal_id, a.result or ""]
        status, rows, more, due, dead, *rest = await self._run("take", thread_key, args,
                                                                "inbox take")
        status = text(status)
        if status == "fenced":
            return Taken(fenced=True)
        entries = []
        for number, body, mode, attempts, state in rows:
            entries.append(self._entry(thread_key, str(as_int(number)), body, mode, attempts,
                                       text(state)))
        return Taken(
            tuple(e for e in entries if e is not None), paused=status == "paused",
            stopped=status == "stopped", more=as_int(more) == 1,
            next_due=float(text(due)) / 1000 if due else None,
            dead=tuple(text(d) for d in dead), pending=as_int(rest[0]) if rest else None,
        )

    def _entry(self, thread_key: str, entry_id: str, body: Any, mode: Any, attempts: Any,
               state: str, holder: str | None = None, due: float | None = None
               ) -> InboxEntry | None:
        try:
            return decode_entry(entry_id, body, text(mode), as_int(attempts),
                                state=state, holder=holder, due_at=due)  # type: ignore[arg-type]
        except (KeyError, TypeError, ValueError) as exc:
            self._log.warning("signals.inbox_entry_dropped", key=thread_key, entry_id=entry_id,
                              error=repr(exc))
            return None

    async def settle(
        self, thread_key: str, run: RunRef, *, acks: Sequence[Ack] = (),
        failed: Sequence[str] = (), returned: Sequence[str] = (), error: str | None = None,
    ) -> bool:
        args: list[Any] = [run.run_id, "" if run.token is None else run.token,
                           (error or "")[:2000], len(acks), len(failed)]
        for a in acks:
            args += [a.entry_id, a.signal_id, a.result or ""]
        args += [*failed, *returned]
        [ok] = await self._run("settle", thread_key, args, "inbox settle")
        return as_int(ok) == 1

    async def withdraw(
        self, thread_key: str, signal_ids: Sequence[str] | None, *, held: bool = False,
        run_id: str = "",
    ) -> list[str]:
        if signal_ids is not None and not signal_ids:
            return []
        args = ["1" if held else "0", run_id, *(signal_ids or ())]
        [removed] = await self._run("withdraw", thread_key, args,
                                    f"cancel on thread {thread_key!r}")
        return [text(s) for s in removed]

    async def entries(
        self, thread_key: str, *, limit: int = 100, offset: int = 0
    ) -> list[InboxEntry]:
        k = self.keys
        async with self._pipeline("inbox read") as pipe:
            pipe.hgetall(k.thread(thread_key, "em"))
            pipe.hgetall(k.thread(thread_key, "eb"))
            metas, bodies = await pipe.execute()
        rows = []
        for raw_seq, raw_meta in metas.items():
            seq = text(raw_seq)
            meta = json.loads(raw_meta)
            body = bodies.get(raw_seq)
            if body is None:
                continue
            rows.append((-int(meta.get("p", 0)), int(seq), seq, meta, body))
        rows.sort()
        out = []
        for _, _, seq, meta, body in rows[offset: offset + limit]:
            due = meta.get("d")
            entry = self._entry(thread_key, seq, body, meta.get("m", "deliver"), meta.get("n", 0),
                                meta.get("st", "ready"), meta.get("h"),
                                due / 1000 if due is not None else None)
            if entry is not None:
                out.append(entry)
        return out

    async def look_at(self, thread_key: str, at: float) -> None:
        await self._run("look_at", thread_key, [int(at * 1000)], "pending index update")

    async def pause(self, thread_key: str, paused: bool) -> bool:
        [was] = await self._run("pause", thread_key, ["1" if paused else "0"],
                                f"pause of thread {thread_key!r}")
        return as_int(was) == 1

    async def describe(self, thread_keys: Sequence[str]) -> dict[str, ThreadState]:
        k = self.keys
        async with self._pipeline("thread info read") as pipe:
            for t in thread_keys:
                pipe.hgetall(k.thread(t, "meta"))
                pipe.hlen(k.thread(t, "em"))
                pipe.zcard(k.thread(t, "rq"))
                pipe.hlen(k.thread(t, "hd"))
                pipe.zrange(k.thread(t, "lt"), 0, 0, withscores=True)
            replies = await pipe.execute()
        out: dict[str, ThreadState] = {}
        now_ms = time.time() * 1000
        for i, thread in enumerate(thread_keys):
            meta, pending, ready, held, first = replies[5 * i: 5 * i + 5]
            raw = {text(a): text(b) for a, b in (meta or {}).items()}
            due_ms = float(first[0][1]) if first else None
            out[thread] = ThreadState(
                pending=int(pending),
                ready=int(ready) > 0 or int(held) > 0 or (due_ms is not None and due_ms <= now_ms),
                paused=raw.get("paused") == "1",
                last=float(raw["last"]) if "last" in raw else None,
                since=float(raw["since"]) if "since" in raw else None,
                run=raw.get("run"), next_due=due_ms / 1000 if due_ms is not None else None,
                abort=raw.get("abort"),
            )
        return out

    async def dead_letters(self, thread_key: str, *, limit: int = 100) -> list[DeadLetter]:
        async with self._errors("dead-letter read"):
            raw: Any = await self.client.hgetall(self.keys.thread(thread_key, "dead"))
        out = []
        for value in raw.values():
            obj = json.loads(value)
            signal = Signal.from_dict(json.loads(obj["s"]), mode=obj.get("m", "deliver"))
            out.append(DeadLetter(signal, int(obj["n"]), obj.get("e") or None, float(obj["at"])))
        return sorted(out, key=lambda d: d.at)[:limit]

    async def revive(
        self, thread_key: str, signal_ids: Sequence[str] | None, *, purge: bool = False
    ) -> list[str]:
        if signal_ids is not None and not signal_ids:
            return []
        [found] = await self._run("revive", thread_key, ["1" if purge else "0",
                                                         *(signal_ids or ())],
                                  "dead-letter retry")
        return [text(s) for s in found]

