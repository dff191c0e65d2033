"""One soak run: the deployment, the sender, the faults, the drain (``python -m signals.soak``).

Phases: start the deployment (Redis and the proxy when the soak owns them, the worker
processes, or the in-memory runtimes); for ``--seconds``, send signals with known ids while
the fault loops kill owners, restart Redis and black-hole workers' connections; then stop the
faults (every route forwards, Redis is up), wait until every accepted signal's receipt is
final (at most ``--drain-seconds``), stop the workers gracefully, and hand the facts to the
verifier. Everything runs in task groups; each loop ends by itself once the fault phase is
over (an operation in progress, such as a Redis restart, completes first).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
import uuid
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import anyio

from _signal_leases.errors import BackendError
from signals._model import Receipt
from signals._runtime import SignalRuntime
from signals.soak.fleet import Fleet, Slot
from signals.soak.options import FactoryContext, SoakOptions, open_backend, runtime_settings
from signals.soak.proxy import Route
from signals.soak.record import FenceStore, Recorder, make_agent
from signals.soak.redis_server import OwnRedis, redis_server_binary
from signals.soak.sender import SendStats, SignalSender

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["Facts", "SoakRun", "describe"]

PROGRESS_EVERY_S = 10.0


@dataclass
class Facts:
    """What the soak did and saw, for the verifier (times are ``time.monotonic()``)."""

    options: SoakOptions
    workdir: Path
    key_prefix: str
    redis: str
    sends: SendStats = field(default_factory=SendStats)
    fleet: Fleet | None = None
    restarts: list[tuple[float, float]] = field(default_factory=list)  # (at, seconds down)
    holes: list[tuple[int, float, float]] = field(default_factory=list)  # (slot, at, seconds)
    receipts: dict[str, Receipt | None] = field(default_factory=dict)
    fault_s: float = 0.0
    drain_s: float = 0.0
    hung_at_stop: int = 0
    ended_at: float = 0.0
    stuck: dict[str, dict[str, Any]] = field(default_factory=dict)  # see SoakRun._diagnose


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _via(url: str, port: int) -> str:
    """``url`` with its host and port replaced by 127.0.0.1:``port`` (credentials and
    database kept)."""
    parts = urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    netloc = f"{auth}@127.0.0.1:{port}" if auth else f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


class SoakRun:
    """One run of the soak (see the module)."""

    def __init__(self, options: SoakOptions, workdir: Path) -> None:
        self.o = options
        self.workdir = workdir
        self.threads = [f"t{i:03d}" for i in range(options.threads)]
        self.stop = anyio.Event()
        self.server: Any = None  # the soak's own server (OwnRedis or OwnPostgres), restarted
        self.fleet: Fleet | None = None
        self.t0 = 0.0
        prefix = f"soak-{uuid.uuid4().hex[:8]}"
        self.facts = Facts(options, workdir, prefix, options.redis_url or "")

    async def run(self) -> Facts:
        if self.o.backend == "memory":
            await self._run_memory()
        else:
            await self._run_processes()
        self.facts.ended_at = time.monotonic()
        sends = self.facts.sends
        (self.workdir / "sends.json").write_text(json.dumps(
            {"accepted": sends.accepted, "unconfirmed": sends.unconfirmed}
        ))
        return self.facts

    # -- deployments -----------------------------------------------------------------------

    async def _run_memory(self) -> None:
        from pubsub import InMemoryPubSub

        records = self.workdir / "records"
        recorder = Recorder(records / f"memory-{os.getpid()}.jsonl")
        fence = FenceStore(records / "fence")
        self.facts.redis = "none (in memory, one process)"
        try:
            async with InMemoryPubSub() as pubsub, AsyncExitStack() as stack:
                for i in range(self.o.workers):
                    agent = make_agent(recorder, fence, work_ms=self.o.work_ms,
                                       rng=random.Random(self.o.seed * 31 + i),
                                       block_ms=self.o.block_ms)
                    await stack.enter_async_context(SignalRuntime(
                        pubsub=pubsub, agent=agent, **runtime_settings(self.o.ttl_ms)
                    ))
                sender = await stack.enter_async_context(SignalRuntime(pubsub=pubsub,
                                                                       agent=None))
                await self._faults_phase(sender)
                await self._drain(sender)
        finally:
            recorder.close()

    async def _run_processes(self) -> None:
        o = self.o
        async with AsyncExitStack() as stack:
            url = o.redis_url
            if o.backend == "sqlite":
                url = str(self.workdir / "signals.db")
                self.facts.redis = f"none (SQLite file {url}, shared by every process)"
            if o.backend == "postgres":
                url = o.postgres_dsn
                self.facts.redis = "none (PostgreSQL at --postgres-dsn)"
            if o.own_postgres:
                from signals.soak.postgres_server import OwnPostgres, postgres_bin_dir

                bin_dir = postgres_bin_dir()
                if bin_dir is None:
                    raise RuntimeError("PostgreSQL is not installed (apt-get install -y "
                                       "postgresql), or pass --postgres-dsn")
                self.server = OwnPostgres(bin_dir)
                await self.server.start()
                stack.push_async_callback(self.server.stop)
                url = self.server.url
                self.facts.redis = f"none (own PostgreSQL on {url}, fsync on)"
            if o.own_redis:
                binary = redis_server_binary()
                if binary is None:
                    raise RuntimeError("redis-server is not on PATH (apt-get install -y "
                                       "redis-server), or pass --redis-url")
                self.server = OwnRedis(binary, self.workdir / "redis",
                                       persistence=not o.no_aof)
                await self.server.start()
                stack.push_async_callback(self.server.stop)
                url = self.server.url
                durability = "no persistence" if o.no_aof else "AOF, appendfsync always"
                self.facts.redis = f"own redis-server on {url} ({durability})"
            tg = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(tg.cancel_scope.cancel)  # the proxy routes, at the very end
            fleet = self.fleet = self.facts.fleet = Fleet(
                backend=o.backend, key_prefix=self.facts.key_prefix, ttl_ms=o.ttl_ms,
                work_ms=o.work_ms, seed=o.seed, workdir=self.workdir, say=_say,
                block_ms=o.block_ms,
            )
            for index in range(o.workers):
                slot = Slot(index, url)
                if o.proxied and url is not None:
                    parts = urlsplit(url)
                    slot.route = Route(parts.hostname or "127.0.0.1", parts.port or 6379)
                    slot.url = _via(url, await tg.start(slot.route.serve))
                fleet.slots.append(slot)
            for slot in fleet.slots:
                tg.start_soon(fleet.keep, slot, name=f"soak worker slot {slot.index}")
            try:
                await fleet.wait_ready()
                _say(f"soak: {o.workers} workers ready ({self.facts.redis or o.backend})")
                ctx = FactoryContext("sender", self.facts.key_prefix, url, None, o.ttl_ms)
                backend = await open_backend(o.backend, ctx)
                async with AsyncExitStack() as sender_stack:
                    await backend.enter(sender_stack)
                    sender = await sender_stack.enter_async_context(
                        SignalRuntime(agent=None, **backend.runtime_kwargs()))
                    await self._faults_phase(sender)
                    await self._heal()
                    await self._drain(sender)
            finally:
                with anyio.CancelScope(shield=True):
                    await self._heal()
                    self.facts.hung_at_stop = await fleet.stop()

    async def _heal(self) -> None:
        """End every fault: all routes forward, Redis runs."""
        if self.fleet is not None:
            for slot in self.fleet.slots:
                if slot.route is not None:
                    slot.route.resume()
        if self.server is not None:
            await self.server.ensure_running()

    # -- the fault phase -------------------------------------------------------------------

    async def _faults_phase(self, sender: SignalRuntime) -> None:
        o = self.o
        self.t0 = time.monotonic()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._sender(sender).run, name="soak sender")
            tg.start_soon(self._progress_loop, name="soak progress")
            if o.kills:
                tg.start_soon(self._kill_loop, sender, name="soak kills")
            if o.restarts:
                tg.start_soon(self._restart_loop, name="soak server restarts")
            if o.blackholes:
                tg.start_soon(self._blackhole_loop, sender, name="soak black holes")
            await anyio.sleep(o.seconds)
            self.stop.set()
        self.facts.fault_s = time.monotonic() - self.t0

    async def _pause_until(self, at: float) -> bool:
        """Sleep until monotonic time ``at``; ``False`` if the fault phase ended first."""
        with anyio.move_on_after(max(0.0, at - time.monotonic())):
            await self.stop.wait()
        return not self.stop.is_set()

    def _schedule(self, rng: random.Random, every: float, k: int) -> float:
        """The ``k``-th time of a periodic fault: on a grid, jittered by up to a fifth."""
        return self.t0 + (k + rng.uniform(-0.2, 0.2)) * every

    async def _pick_owner(self, sender: SignalRuntime, rng: random.Random) -> Slot | None:
        """A random ready worker that owns a thread now (any ready worker if none does)."""
        assert self.fleet is not None
        ready = self.fleet.ready
        owners: set[str | None] = set()
        try:
            with anyio.fail_after(2):
                owners = {t.runtime_id for t in await sender.threads(active=True)}
        except (TimeoutError, BackendError):
            pass
        pool = [s for s in ready if s.runtime_id in owners] or ready
        return rng.choice(pool) if pool else None

    async def _kill_loop(self, sender: SignalRuntime) -> None:
        assert self.fleet is not None
        rng = random.Random(self.o.seed * 7 + 1)
        k = 0
        while True:
            k += 1
            if not await self._pause_until(self._schedule(rng, self.o.kill_every, k)):
                return
            victim = await self._pick_owner(sender, rng)
            while victim is None and await self._pause_until(time.monotonic() + 0.1):
                victim = await self._pick_owner(sender, rng)  # every worker is starting
            if victim is not None:
                self.fleet.kill(victim)

    async def _restart_loop(self) -> None:
        assert self.server is not None
        rng = random.Random(self.o.seed * 7 + 2)
        k = 0
        while True:
            k += 1
            if not await self._pause_until(self._schedule(rng, self.o.restart_redis_every, k)):
                return
            at = time.monotonic()
            await self.server.restart()
            self.facts.restarts.append((at, time.monotonic() - at))

    async def _blackhole_loop(self, sender: SignalRuntime) -> None:
        rng = random.Random(self.o.seed * 7 + 3)
        k = 0
        while True:
            k += 1
            if not await self._pause_until(self._schedule(rng, self.o.blackhole_every, k)):
                return
            victim = await self._pick_owner(sender, rng)
            if victim is None or victim.route is None:
                continue
            at = time.monotonic()
            victim.route.hold()
            try:
                with anyio.move_on_after(self.o.blackhole_seconds):
                    await self.stop.wait()
            finally:
                victim.route.resume()
                self.facts.holes.append((victim.index, at, time.monotonic() - at))

    async def _progress_loop(self) -> None:
        k = 0
        while True:
            k += 1
            if not await self._pause_until(self.t0 + k * PROGRESS_EVERY_S):
                return
            fleet = self.fleet
            s = self.facts.sends
            workers = f"{len(fleet.ready)}/{len(fleet.slots)}" if fleet else str(self.o.workers)
            _say(f"soak: {k * PROGRESS_EVERY_S:4.0f}s  accepted {len(s.accepted)}  "
                 f"send errors {sum(s.errors.values())}  "
                 f"kills {len(fleet.kills) if fleet else 0}  "
                 f"server restarts {len(self.facts.restarts)}  "
                 f"black holes {len(self.facts.holes)}  workers ready {workers}")

    # -- sending and the drain -------------------------------------------------------------

    def _sender(self, runtime: SignalRuntime) -> SignalSender:
        return SignalSender(runtime, self.threads, rate=self.o.rate, seed=self.o.seed,
                            stop=self.stop, stats=self.facts.sends, say=_say)

    async def _drain(self, sender: SignalRuntime) -> None:
        self.facts.drain_s = await self._sender(sender).drain(self.facts.receipts,
                                                              self.o.drain_seconds)
        await self._diagnose(sender)

    async def _diagnose(self, sender: SignalRuntime) -> None:
        """For each thread still holding an unfinished accepted signal after the drain: its
        last run (from the thread's output stream, whose ``run.started`` parts name every
        run) and whether the soak had killed that run's worker."""
        s, receipts = self.facts.sends, self.facts.receipts
        killed = {k.runtime_id for k in self.fleet.kills} if self.fleet is not None else set()

        def unfinished(sid: str) -> bool:
            receipt = receipts.get(sid)
            return receipt is None or not receipt.done

        threads = sorted({thread for sid, thread in s.accepted.items() if unfinished(sid)})
        for thread in threads[:100]:
            last_run: str | None = None
            try:
                with anyio.fail_after(10):
                    async for part in sender.stream(thread, follow=False):
                        if part.kind == "run.started":
                            last_run = part.run_id
                    info = await sender.thread(thread)
            except (TimeoutError, BackendError) as exc:
                self.facts.stuck[thread] = {"error": repr(exc)}
                continue
            runtime = last_run.partition("/")[0] if last_run else None
            self.facts.stuck[thread] = {
                "last_run": last_run, "last_owner_killed": runtime in killed,
                "owner_now": info.owner, "pending": info.pending,
            }


def describe(facts: Facts) -> dict[str, Any]:
    """The run's settings, for the report."""
    o = facts.options
    return {
        "backend": o.backend, "redis": facts.redis, "seconds": o.seconds,
        "workers": o.workers, "threads": o.threads, "ttl_ms": o.ttl_ms, "rate": o.rate,
        "work_ms": o.work_ms, "seed": o.seed, "blocking_agent_ms": o.block_ms or None,
        "kill_every": o.kill_every if o.kills else None,
        "restart_redis_every": o.restart_redis_every if o.restarts else None,
        "blackhole_every": o.blackhole_every if o.blackholes else None,
        "blackhole_seconds": o.blackhole_seconds if o.blackholes else None,
        "proxy": o.proxied, "key_prefix": facts.key_prefix, "records": str(facts.workdir),
    }
