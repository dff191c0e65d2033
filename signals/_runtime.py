"""``SignalRuntime``: routes signals to the one run that owns each thread.

Per process, not per thread: one lease heartbeat (one renewal per interval for all leases,
where the provider has sessions or batches), one notice listener, one recovery task that is
also the process's one timer (it wakes at the next due time of any thread). Per active
thread: the chain's task, which runs the agent. See ``docs/signals.md`` for the model and
``docs/guarantees.md`` for what holds.

The runtime's lifecycle, send and its runs; control and inspection, schedules, streams, and
recovery with the notices are mixins in their own modules.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeAlias

import anyio
from anyio import AsyncContextManagerMixin

from _signal_leases.aio import WakeQueue, owned_task_group, unix_now
from _signal_leases.errors import ClosedError
from _signal_leases.logs import get_logger
from _signal_leases.validation import (
    check_identifier,
    check_int,
    check_optional_int,
)
from leases import LeaseHeartbeat, LeaseProvider
from signals import _pubsub_guard  # noqa: F401  (a clear ImportError if `pubsub` is not ours)
from signals._chain import Chain, ChainSettings, check_reducers
from signals._control import ControlMixin
from signals._model import (
    DEFAULT_MAX_SIGNAL_BYTES,
    Delivery,
    EntryMode,
    IfActive,
    IfIdle,
    Signal,
    check_max_bytes,
)
from signals._recovery import RecoveryMixin
from signals._resolve import check_agent, check_pubsub, check_store, resolve_core, resolve_leases
from signals._run import Reducer, Run
from signals._schedules import Scheduler, SchedulesMixin
from signals._sending import check_limits, delivered, prepare, refused_after, refused_before
from signals._streams import StreamsMixin
from signals._telemetry import Telemetry
from signals.kit._capabilities import RuntimeInfo
from signals.kit._core import Overflow, SignalCore, decode_entry, run_runtime
from signals.kit._derived import TOPIC_PREFIX
from signals.kit._store import KitStore

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from _signal_leases.logs import Logger
    from pubsub import PubSub

__all__ = ["Agent", "SignalRuntime"]

Agent: TypeAlias = Callable[[Run], Awaitable[None]]
"""``async def agent(run: Run) -> None``: the code that runs while a process owns a thread."""

logger = get_logger("signals")


class SignalRuntime(ControlMixin, SchedulesMixin, StreamsMixin, RecoveryMixin,
                    AsyncContextManagerMixin):
    """Receive signals for threads; run ``agent`` in exactly one process per thread.

    ``await runtime.send(thread_key, signal)`` either wakes the idle thread (this process
    wins the lease and runs the agent: outcome ``wake``) or hands the signal to the active
    run, here or in the owner process (``deliver``), per the ``if_active`` / ``if_idle``
    policies. ``agent=None`` makes a sender-only runtime: it stores signals and notifies the
    workers, and never takes a lease.

    * Leases: ``leases=`` or, by structural detection, the pub/sub's provider
      (:func:`leases.resolve_lease_provider`), falling back to the no-op provider.
    * Store: ``inbox=`` (a :class:`~signals.kit.SignalCore`) or :func:`resolve_signal_store`.
      Every accepted signal is in the store before ``send`` returns and stays there until a
      run acknowledges it. What the core lacks (notices, registry, streams, fused calls) is
      derived from the leases and the pub/sub (:class:`~signals.kit.KitStore`).
    * One :class:`~leases.LeaseHeartbeat` per runtime keeps every lease alive; a lost lease
      cancels its run before anyone else can own the thread. Queued work goes to the next run
      with ``transfer_lease``; the thread is released only when no work is ready.
    * ``max_attempts``: a signal handed to that many runs that did not acknowledge it goes to
      the thread's dead letters. ``run_timeout_ms``: a run that takes longer is cancelled
      (default: no limit). ``max_signal_bytes``: the largest encoded signal, result or stream
      part (1 MiB). ``max_concurrent_runs``: a full process starts no new run; the signal
      stays queued for another worker or for recovery (default: no limit).
    * ``reducers``: ``{lane: fn}``, where ``fn(signals) -> payload`` folds the pending signals
      of a ``coalesce`` lane into one at hand-out. ``max_pending_per_thread`` and
      ``overflow`` (``reject`` or ``drop_oldest``): a cap on the signals accepted and not yet
      acknowledged per thread (default: no cap). See docs/dispositions.md.
    * Every ``recover_interval_ms`` (default: the lease TTL) the runtime takes over threads
      whose owner died and ownerless threads with work; its timer also wakes at the next due
      time of a delayed signal.

    Use as ``async with SignalRuntime(...) as runtime``. Leaving waits for active runs to
    finish (at most ``shutdown_timeout_ms``, default: no limit); a cancellation while leaving,
    or the timeout, cancels them (reason ``shutdown``; their signals stay for the next owner).
    """

    def __init__(
        self,
        *,
        pubsub: PubSub,
        agent: Agent | None,
        leases: LeaseProvider | None = None,
        inbox: SignalCore | None = None,
        lease_ttl_ms: int = 15_000,
        idle_wait_ms: int = 0,
        recover_interval_ms: int | None = None,
        runtime_id: str | None = None,
        max_attempts: int = 5,
        run_timeout_ms: int | None = None,
        max_signal_bytes: int = DEFAULT_MAX_SIGNAL_BYTES,
        max_concurrent_runs: int | None = None,
        shutdown_timeout_ms: int | None = None,
        reducers: Mapping[str, Reducer] | None = None,
        max_pending_per_thread: int | None = None,
        overflow: Overflow = "reject",
    ) -> None:
        check_pubsub(pubsub)
        check_agent(agent)
        self.lease_ttl_ms = check_int("lease_ttl_ms", lease_ttl_ms, minimum=3)
        self.idle_wait_ms = check_int("idle_wait_ms", idle_wait_ms, minimum=0)
        self.recover_interval_ms = check_int(
            "recover_interval_ms",
            recover_interval_ms if recover_interval_ms is not None else lease_ttl_ms,
        )
        self.max_attempts = check_int("max_attempts", max_attempts)
        self.run_timeout_ms = check_optional_int("run_timeout_ms", run_timeout_ms)
        self.max_signal_bytes = check_max_bytes(max_signal_bytes)
        self.max_concurrent_runs = check_optional_int("max_concurrent_runs", max_concurrent_runs)
        self.shutdown_timeout_ms = check_optional_int("shutdown_timeout_ms", shutdown_timeout_ms,
                                                      minimum=0)
        self.reducers = check_reducers(reducers)
        self.limits = check_limits(max_pending_per_thread, overflow)
        if runtime_id is not None:
            check_identifier("runtime_id", runtime_id)
            if "/" in runtime_id:
                raise ValueError("runtime_id must not contain '/' (run ids are <runtime id>/<n>)")
        self.runtime_id = runtime_id or f"rt-{uuid.uuid4().hex[:12]}"
        self.pubsub = pubsub
        self.agent = agent
        self.leases: LeaseProvider = resolve_leases(pubsub, leases)
        self.store: SignalCore = (
            check_store(inbox) if inbox is not None else resolve_core(pubsub, self.leases)
        )
        self._log: Logger = logger.bind(runtime_id=self.runtime_id)
        self._chains: dict[str, Chain] = {}
        self._starting: set[str] = set()
        self._lost: set[str] = set()  # threads whose lease was lost, to index by recovery
        self._changed: anyio.Event | None = None
        self._taking_back: set[str] = set()  # threads queued to be claimed again here
        self._work: WakeQueue[str | None] = WakeQueue()
        self._next_due: float | None = None  # Unix time the timer wakes at
        self._tg: TaskGroup | None = None
        self._kit: KitStore | None = None
        self._scheduler: Scheduler | None = None
        self._telemetry = Telemetry(pending=self._pending_here)
        self._settings: ChainSettings | None = None
        self._closed = False
        self._run_seq = 0

    # -- lifecycle -------------------------------------------------------------------------

    @asynccontextmanager
    async def __asynccontextmanager__(self) -> AsyncGenerator[SignalRuntime]:
        if self._tg is not None or self._closed:
            raise ClosedError("a SignalRuntime can be entered once")
        async with AsyncExitStack() as stack:
            heartbeat = None
            if self.agent is not None:
                heartbeat = await stack.enter_async_context(
                    LeaseHeartbeat(self.leases, self.lease_ttl_ms, on_lost=self._on_lease_lost)
                )
            kit = self._kit = KitStore(
                self.store, self.leases, self.pubsub, prefix=TOPIC_PREFIX,
                runtime_id=self.runtime_id, heartbeat=heartbeat, new_run_id=self._new_run_id,
                on_later=self._due_hint,
            )
            if self.agent is not None:
                self._settings = ChainSettings(
                    agent=self.agent, store=kit, idle_wait_s=self.idle_wait_ms / 1000,
                    max_attempts=self.max_attempts, max_bytes=self.max_signal_bytes,
                    run_timeout_s=(
                        None if self.run_timeout_ms is None else self.run_timeout_ms / 1000
                    ),
                    reducers=self.reducers, log=self._log, on_tick=self._on_tick,
                    telemetry=self._telemetry,
                )
                await kit.register(self._info(), self.lease_ttl_ms)
                stack.push_async_callback(self._unregister)
            tg = await stack.enter_async_context(owned_task_group())
            if self.agent is not None:
                await stack.enter_async_context(
                    kit.listen(self.runtime_id, self._on_notice, worker=True)
                )
                tg.start_soon(self._recovery_loop, name="signals recovery")
            self._tg = tg
            try:
                yield self
            except BaseException:
                await self._shutdown(graceful=False)
                raise
            else:
                await self._shutdown(graceful=True)
            finally:
                # The task group cancels its tasks when the stack reaches it, after the notice
                # subscription is closed: cancelling it here would cancel that close too, and
                # the body's exception would be lost in the cancellation.
                self._closed = True

    def _info(self) -> RuntimeInfo:
        return RuntimeInfo(self.runtime_id, socket.gethostname(), os.getpid(), time.time(),
                           worker=True)

    async def _unregister(self) -> None:
        assert self._kit is not None
        with anyio.CancelScope(shield=True), anyio.move_on_after(2):
            try:
                await self._kit.registry.unregister_runtime(self.runtime_id)
            except Exception as exc:
                self._log.warning("signals.unregister_failed", error=repr(exc))

    async def _shutdown(self, *, graceful: bool) -> None:
        """Stop taking work; let runs finish (graceful) or cancel them; bounded either way."""
        self._closed = True
        self._taking_back.clear()  # no more claims: what they would take stays in the inbox
        if graceful:
            for chain in list(self._chains.values()):
                chain.wind_down()  # a run waiting for its next signal ends now
            timeout = self.shutdown_timeout_ms
            try:
                with anyio.move_on_after(float("inf") if timeout is None else timeout / 1000):
                    await self.wait_idle()
            except anyio.get_cancelled_exc_class():
                await self._cancel_runs()
                raise
        await self._cancel_runs()

    async def _cancel_runs(self) -> None:
        for chain in list(self._chains.values()):
            chain.cancel_run("shutdown")
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            await self.wait_idle()

    def _require_open(self) -> TaskGroup:
        if self._tg is None or self._closed:
            raise ClosedError("enter the runtime first: `async with SignalRuntime(...) as runtime`")
        return self._tg

    @property
    def inbox(self) -> KitStore:
        """The runtime's view of its inbox (:class:`~signals.kit.KitStore`: ``core``,
        ``inbox_pending_count(thread_key)``, ...), once entered (else ``ClosedError``)."""
        return self._kit_open()

    def _kit_open(self) -> KitStore:
        self._require_open()
        assert self._kit is not None
        return self._kit

    # -- public API ------------------------------------------------------------------------

    def _poke(self) -> None:
        """Wake :meth:`wait_idle` to look again."""
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def _full(self) -> bool:
        limit = self.max_concurrent_runs
        return limit is not None and len(self._chains) + len(self._starting) >= limit

    async def send(
        self,
        thread_key: str,
        signal: Signal | Any,
        *,
        if_active: IfActive = "deliver",
        if_idle: IfIdle = "wake",
        delay_ms: int | None = None,
        expires_in_ms: int | None = None,
    ) -> Delivery:
        """Accept ``signal`` for ``thread_key`` and route it; see :class:`Delivery` outcomes.

        A value that is not a :class:`Signal` becomes the payload of a new ``user`` signal.
        ``delay_ms`` sets its ``not_before`` that far from now, ``expires_in_ms`` its
        ``expires_at``.

        * Active thread (a run here, or a lease owner elsewhere): ``if_active`` decides:
          ``deliver`` (to the active run), ``queue`` (for a run of its own after the active
          one), ``interrupt`` (cancel the active run at its next checkpoint; a new run gets
          its unacknowledged signals and this one, with ``Run.interrupted`` set),
          ``discard`` or ``reject`` (nothing stored).
        * Idle thread: ``wake`` starts a run in this process if it wins the lease (``wake``;
          a sender-only or full runtime leaves it ``queued`` for a worker), ``enqueue`` stores
          it and notifies the workers without running it here (``queued``), ``discard`` drops
          it.
        * A signal id already accepted for this thread is a duplicate: nothing is stored or
          started (``discarded``, ``duplicate=True``, ``receipt`` = the original's). Then, in
          order: ``unchanged`` (its lane's last signal had the same ``cache_key``), the lane's
          ``supersede``, and the pending cap (``rejected`` with a ``reason``, or the oldest
          ``dropped``). A signal with a ``not_before`` in the future is ``scheduled``.

        Returns once the signal is stored and the owner (or the workers) told; a sender can
        exit right after. Backend errors propagate (never read as "idle").
        """
        signal = prepare(thread_key, signal, if_active, if_idle, delay_ms, expires_in_ms)
        if (signal.merge == "coalesce" and signal.lane is not None
                and signal.lane not in self.reducers):
            raise ValueError(
                f"signal {signal.id!r} has merge='coalesce' on lane {signal.lane!r}, and this "
                f"runtime has no reducer for it: pass reducers={{{signal.lane!r}: fn}} to "
                f"SignalRuntime (every runtime that runs the thread needs it)"
            )
        if self._telemetry.quiet():
            return await self._send(thread_key, signal, if_active, if_idle)
        return await self._telemetry.traced_send(
            thread_key, signal, lambda s: self._send(thread_key, s, if_active, if_idle))

    async def _send(self, thread_key: str, signal: Signal, if_active: IfActive,
                    if_idle: IfIdle) -> Delivery:
        signal.encode(self.max_signal_bytes)  # SignalTooLargeError before anything is written
        kit = self._kit_open()
        log = self._log.bind(key=thread_key, signal_id=signal.id)
        chain = self._chains.get(thread_key)
        if if_active in ("discard", "reject") or if_idle == "discard":
            owner = chain.run_id if chain else await self.leases.get_lease_owner(thread_key)
            refused = refused_before(owner, thread_key, signal, if_active, if_idle, log)
            if refused is not None:
                return refused
        mode: EntryMode = "queue" if if_active == "queue" else "deliver"
        local = chain is not None or thread_key in self._starting
        full = self._full()
        claim = self.agent is not None and if_idle == "wake" and not local and not full
        if claim:
            self._starting.add(thread_key)
        try:
            routed, lease = await kit.route(thread_key, signal, mode, claim=claim,
                                            wake_workers=not local, limits=self.limits,
                                            interrupt=if_active == "interrupt")
            if lease is not None:
                self._start_chain(lease)
        finally:
            self._starting.discard(thread_key)
        refused = refused_after(routed, thread_key, signal, log)
        if refused is not None:
            return refused
        accepted = routed.accepted
        if lease is not None:
            log.info("signal.accepted", outcome="wake", run_id=lease.owner, token=lease.token)
            return Delivery("wake", signal.id, thread_key, lease.owner,
                            superseded=accepted.superseded, dropped=accepted.dropped)
        owner = routed.owner
        chain = self._chains.get(thread_key)
        if accepted.due_at is not None:
            if accepted.due_at > unix_now():
                self._due_hint(accepted.due_at)
            return delivered(routed, thread_key, signal, mode, log)
        if if_active == "interrupt" and chain is not None and chain.run_id == owner:
            chain.cancel_run("interrupt", owner)  # ours: at once (the route aborted it)
        if chain is not None and routed.carried and accepted.entry_id is not None:
            carried = decode_entry(accepted.entry_id, signal.encode(), "deliver", 1,
                                   state="carried", holder=owner, signal=signal)
            chain.offer(carried, owner)
        elif chain is not None and (owner is None or run_runtime(owner) == self.runtime_id):
            chain.doorbell.ring()
        elif owner is None and local and self.agent is not None:
            self._taking_back.add(thread_key)  # our chain ended meanwhile: take it back
            self._work.put(thread_key)
        backpressure = full and if_idle == "wake" and owner is None and self.agent is not None
        return delivered(routed, thread_key, signal, mode, log, backpressure=backpressure)


    # -- runs ------------------------------------------------------------------------------

    def _new_run_id(self) -> str:
        self._run_seq += 1
        return f"{self.runtime_id}/{self._run_seq}-{uuid.uuid4().hex[:6]}"

    def _start_chain(self, lease: Any, *, taken_over: bool = False) -> None:
        settings, tg = self._settings, self._tg
        assert settings is not None and tg is not None
        chain = Chain(settings, lease, taken_over=taken_over)
        self._chains[lease.key] = chain
        tg.start_soon(chain.serve, self._chain_ended, name=f"signals thread {lease.key!r}")

    def _chain_ended(self, chain: Chain) -> None:
        if self._chains.get(chain.thread_key) is chain:
            del self._chains[chain.thread_key]
        due = chain.run.next_due if chain.run is not None else None
        if due is not None and not self._closed:
            self._due_hint(due)  # a signal of the thread comes due later: wake for it
        if chain.lease.lost and not self._closed:
            # The thread may still have work: index it for any worker, and try to take it
            # back here.
            self._lost.add(chain.thread_key)
            self._work.put(chain.thread_key)
        self._poke()
