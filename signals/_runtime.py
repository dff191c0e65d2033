"""``SignalRuntime``: routes signals to the one run that owns each thread.

Per process, not per thread: one lease heartbeat (one renewal per interval for all leases,
where the provider has sessions or batches), one notice listener (one connection), one
recovery task. Per active thread: the chain's task, which runs the agent. See
``docs/signals.md`` for the model and ``docs/guarantees.md`` for what holds.

Slightly over 400 lines: the runtime's public entry points; routing, runs, control and
streams are in their own modules.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeAlias

import anyio
from anyio import AsyncContextManagerMixin

from _signal_leases.aio import WakeQueue, owned_task_group
from _signal_leases.errors import ClosedError
from _signal_leases.logs import get_logger
from _signal_leases.validation import (
    check_choice,
    check_identifier,
    check_int,
    check_optional_int,
)
from leases import LeaseHeartbeat, LeaseProvider
from signals._chain import Chain, ChainSettings
from signals._control import ControlMixin
from signals._model import (
    DEFAULT_MAX_SIGNAL_BYTES,
    Delivery,
    EntryMode,
    IfActive,
    IfIdle,
    Outcome,
    Signal,
    check_max_bytes,
)
from signals._recovery import RecoveryMixin
from signals._resolve import (
    check_agent,
    check_pubsub,
    check_store,
    resolve_leases,
    resolve_signal_store,
)
from signals._routing import Backend
from signals._run import Run, RunInfo
from signals._store import InboxEntry, Notice, RuntimeInfo, SignalStore, run_runtime
from signals._streams import StreamsMixin

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from _signal_leases.logs import Logger
    from pubsub import PubSub

__all__ = ["Agent", "SignalRuntime"]

Agent: TypeAlias = Callable[[Run], Awaitable[None]]
"""``async def agent(run: Run) -> None``: the code that runs while a process owns a thread."""

logger = get_logger("signals")

_IF_ACTIVE = ("deliver", "queue", "interrupt", "discard", "reject")
_IF_IDLE = ("wake", "enqueue", "discard")


class SignalRuntime(ControlMixin, StreamsMixin, RecoveryMixin, AsyncContextManagerMixin):
    """Receive signals for threads; run ``agent`` in exactly one process per thread.

    ``await runtime.send(thread_key, signal)`` either wakes the idle thread (this process
    wins the lease and runs the agent: outcome ``wake``) or hands the signal to the active
    run, here or in the owner process (``deliver``), per the ``if_active`` / ``if_idle``
    policies. ``agent=None`` makes a sender-only runtime: it stores signals and notifies the
    workers, and never takes a lease.

    * Leases: ``leases=`` or, by structural detection, the pub/sub's provider
      (:func:`leases.resolve_lease_provider`), falling back to the no-op provider.
    * Store: ``inbox=`` or :func:`resolve_signal_store`. Every accepted signal is in the store
      before ``send`` returns and stays there until a run acknowledges it.
    * One :class:`~leases.LeaseHeartbeat` per runtime keeps every lease alive; a lost lease
      cancels its run before anyone else can own the thread. Queued work goes to the next run
      with ``transfer_lease``; the thread is released only when its inbox is empty.
    * ``max_attempts``: a signal whose runs failed that many times goes to the thread's dead
      letters. ``run_timeout_ms``: a run that takes longer is cancelled (default: no limit).
      ``max_signal_bytes``: the largest encoded signal, result or stream part (1 MiB).
      ``max_concurrent_runs``: a full process starts no new run; the signal stays queued for
      another worker or for recovery (default: no limit).
    * Every ``recover_interval_ms`` (default: the lease TTL) the runtime takes over threads
      whose owner died (found through the runtime registry) and ownerless threads with work.

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
        inbox: SignalStore | None = None,
        lease_ttl_ms: int = 15_000,
        idle_wait_ms: int = 0,
        recover_interval_ms: int | None = None,
        runtime_id: str | None = None,
        max_attempts: int = 5,
        run_timeout_ms: int | None = None,
        max_signal_bytes: int = DEFAULT_MAX_SIGNAL_BYTES,
        max_concurrent_runs: int | None = None,
        shutdown_timeout_ms: int | None = None,
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
        if runtime_id is not None:
            check_identifier("runtime_id", runtime_id)
            if "/" in runtime_id:
                raise ValueError("runtime_id must not contain '/' (run ids are <runtime id>/<n>)")
        self.runtime_id = runtime_id or f"rt-{uuid.uuid4().hex[:12]}"
        self.pubsub = pubsub
        self.agent = agent
        self.leases: LeaseProvider = resolve_leases(pubsub, leases)
        self.inbox: SignalStore = (
            check_store(inbox) if inbox is not None else resolve_signal_store(pubsub, self.leases)
        )
        self._log: Logger = logger.bind(runtime_id=self.runtime_id)
        self._chains: dict[str, Chain] = {}
        self._starting: set[str] = set()
        self._lost: set[str] = set()  # threads whose lease was lost, to index by recovery
        self._changed: anyio.Event | None = None
        self._work: WakeQueue[str | None] = WakeQueue()
        self._tg: TaskGroup | None = None
        self._backend: Backend | None = None
        self._settings: ChainSettings | None = None
        self._closed = False
        self._run_seq = 0

    @property
    def store(self) -> SignalStore:
        """The store (the same object as ``inbox``)."""
        return self.inbox

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
            backend = self._backend = Backend(
                self.inbox, self.leases, heartbeat, self.runtime_id, self._new_run_id
            )
            if self.agent is not None:
                self._settings = ChainSettings(
                    agent=self.agent, backend=backend, idle_wait_s=self.idle_wait_ms / 1000,
                    max_attempts=self.max_attempts, max_bytes=self.max_signal_bytes,
                    run_timeout_s=(
                        None if self.run_timeout_ms is None else self.run_timeout_ms / 1000
                    ),
                    log=self._log,
                )
                await self.inbox.register_runtime(self._info(), self.lease_ttl_ms)
                stack.push_async_callback(self._unregister)
            tg = await stack.enter_async_context(owned_task_group())
            if self.agent is not None:
                await stack.enter_async_context(
                    self.inbox.listen(self.runtime_id, self._on_notice, worker=True)
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
                self._closed = True
                tg.cancel_scope.cancel()

    def _info(self) -> RuntimeInfo:
        return RuntimeInfo(self.runtime_id, socket.gethostname(), os.getpid(), time.time(),
                           worker=True)

    async def _unregister(self) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(2):
            try:
                await self.inbox.unregister_runtime(self.runtime_id)
            except Exception as exc:
                self._log.warning("signals.unregister_failed", error=repr(exc))

    async def _shutdown(self, *, graceful: bool) -> None:
        """Stop taking work; let runs finish (graceful) or cancel them; bounded either way."""
        self._closed = True
        if graceful:
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

    # -- public API ------------------------------------------------------------------------

    def active_run(self, thread_key: str) -> RunInfo | None:
        """The run this process has on ``thread_key`` right now, or ``None`` (only this
        process's runs: another process may own the thread)."""
        chain = self._chains.get(thread_key)
        return chain.info() if chain is not None else None

    def active_threads(self) -> list[str]:
        """The threads this process runs right now."""
        return list(self._chains)

    async def wait_idle(self, thread_key: str | None = None) -> None:
        """Wait until this process runs nothing (on ``thread_key``, or on any thread)."""
        while (thread_key in self._chains) if thread_key is not None else self._chains:
            if self._changed is None:
                self._changed = anyio.Event()
            await self._changed.wait()

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
    ) -> Delivery:
        """Accept ``signal`` for ``thread_key`` and route it; see :class:`Delivery` outcomes.

        A value that is not a :class:`Signal` becomes the payload of a new ``user`` signal.

        * Active thread (a run here, or a lease owner elsewhere): ``if_active`` decides:
          ``deliver`` (to the active run), ``queue`` (for a run of its own after the active
          one), ``interrupt`` (cancel the active run at its next checkpoint; a new run gets
          its unacknowledged signals and this one, in order, with ``Run.interrupted`` set),
          ``discard`` or ``reject`` (nothing stored).
        * Idle thread: ``wake`` starts a run in this process if it wins the lease (``wake``;
          a sender-only or full runtime leaves it ``queued`` for a worker), ``enqueue`` stores
          it and notifies the workers without running it here (``queued``), ``discard`` drops
          it.
        * A signal id already accepted for this thread is a duplicate: nothing is stored or
          started (``discarded``, ``duplicate=True``, ``receipt`` = the original's).

        Returns once the signal is stored and the owner (or the workers) told; a sender can
        exit right after. Backend errors propagate (never read as "idle").
        """
        check_identifier("thread key", thread_key)
        if not isinstance(signal, Signal):
            signal = Signal(payload=signal)
        check_choice("if_active", if_active, _IF_ACTIVE)
        check_choice("if_idle", if_idle, _IF_IDLE)
        signal.encode(self.max_signal_bytes)  # SignalTooLargeError before anything is written
        self._require_open()
        backend = self._backend
        assert backend is not None
        log = self._log.bind(key=thread_key, signal_id=signal.id)
        chain = self._chains.get(thread_key)
        if if_active in ("discard", "reject") or if_idle == "discard":
            owner = chain.run_id if chain else await self.leases.get_lease_owner(thread_key)
            if owner is not None and if_active in ("discard", "reject"):
                outcome: Outcome = "discarded" if if_active == "discard" else "rejected"
                log.info("signal.refused", outcome=outcome, owner=owner)
                return Delivery(outcome, signal.id, thread_key, owner)
            if owner is None and if_idle == "discard":
                log.info("signal.refused", outcome="discarded", reason="idle")
                return Delivery("discarded", signal.id, thread_key)
        mode: EntryMode = "queue" if if_active == "queue" else "deliver"
        local = chain is not None or thread_key in self._starting
        full = self._full()
        claim = self.agent is not None and if_idle == "wake" and not local and not full
        if claim:
            self._starting.add(thread_key)
        try:
            routed, lease = await backend.route(
                thread_key, signal, mode, claim=claim, wake_workers=not local
            )
            if lease is not None:
                self._start_chain(lease)
        finally:
            self._starting.discard(thread_key)
        if not routed.fresh:
            log.info("signal.duplicate", owner=routed.owner,
                     status=routed.receipt.status if routed.receipt else None)
            return Delivery("discarded", signal.id, thread_key, routed.owner, duplicate=True,
                            receipt=routed.receipt)
        if lease is not None:
            log.info("signal.accepted", outcome="wake", run_id=lease.owner, token=lease.token)
            return Delivery("wake", signal.id, thread_key, lease.owner)
        owner = routed.owner
        chain = self._chains.get(thread_key)
        if if_active == "interrupt" and owner is not None:
            if chain is not None and chain.run_id == owner:
                chain.cancel_run("interrupt", owner)
            else:
                await backend.abort(thread_key, owner, reason="interrupt", clear=False)
        if chain is not None and routed.carried and routed.entry_id is not None:
            carried = InboxEntry(routed.entry_id, signal.evolve(attempt=1, mode="deliver"),
                                 "deliver", 1, len(signal.encode()), delivered=1)
            chain.offer(carried, owner)
        elif chain is not None and (owner is None or run_runtime(owner) == self.runtime_id):
            chain.doorbell.ring()
        elif owner is None and local and self.agent is not None:
            self._work.put(thread_key)  # our chain ended meanwhile: take the thread back
        outcome = "queued" if mode == "queue" or owner is None else "deliver"
        backpressure = full and if_idle == "wake" and owner is None and self.agent is not None
        log.info("signal.accepted", outcome=outcome, run_id=owner, backpressure=backpressure)
        return Delivery(outcome, signal.id, thread_key, owner, backpressure=backpressure)

    # -- runs ------------------------------------------------------------------------------

    def _new_run_id(self) -> str:
        self._run_seq += 1
        return f"{self.runtime_id}/{self._run_seq}-{uuid.uuid4().hex[:6]}"

    def _start_chain(self, lease: Any) -> None:
        settings, tg = self._settings, self._tg
        assert settings is not None and tg is not None
        chain = Chain(settings, lease)
        self._chains[lease.key] = chain
        tg.start_soon(chain.serve, self._chain_ended, name=f"signals thread {lease.key!r}")

    def _chain_ended(self, chain: Chain) -> None:
        if self._chains.get(chain.thread_key) is chain:
            del self._chains[chain.thread_key]
        if chain.lease.lost and not self._closed:
            # The thread may still have work and nobody points at it but our registry entry
            # (we are alive): index it for any worker, and try to take it back here.
            self._lost.add(chain.thread_key)
            self._work.put(chain.thread_key)
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def _on_lease_lost(self, lease: Any) -> None:
        chain = self._chains.get(lease.key)
        if chain is not None and chain.lease is lease:
            self._log.warning("run.lease_lost", key=lease.key, run_id=lease.owner,
                              token=lease.token, reason=lease.lost_reason)

    def _on_notice(self, notice: Notice) -> None:
        if notice.kind == "resync":
            for each in self._chains.values():
                each.doorbell.ring()
            self._work.put(None)
            return
        chain = self._chains.get(notice.thread_key)
        if notice.kind == "signal":
            if chain is not None and notice.entry is not None:
                chain.offer(notice.entry, notice.run_id)
            elif chain is not None:
                chain.doorbell.ring()
        elif notice.kind == "work":
            if chain is None:
                self._work.put(notice.thread_key)
        elif notice.kind == "abort" and chain is not None:
            chain.cancel_run(_abort_reason(notice.reason), notice.run_id)


def _abort_reason(reason: str | None) -> str:
    """The reason a run cancelled by an abort notice reports (``interrupt`` stays itself)."""
    if reason == "interrupt":
        return "interrupt"
    return f"abort: {reason}" if reason else "abort"
