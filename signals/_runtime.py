"""``SignalRuntime``: routes signals to the one run that owns each thread."""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeAlias

import anyio
import structlog

from leases import (
    InMemoryLeaseProvider,
    LeaseKeeper,
    LeaseNotAcquiredError,
    LeaseProvider,
    NoopLeaseProvider,
    resolve_lease_provider,
)
from leases._validation import check_ttl_ms
from pubsub import Event, PubSub, Subscription

from ._errors import ConfigurationError, RuntimeClosedError
from ._inbox import EntryMode, InboxEntry, SignalInbox, is_signal_inbox
from ._memory_inbox import InMemorySignalInbox
from ._model import Delivery, IfActive, IfIdle, Outcome, Signal
from ._run import POLL_INTERVAL_S, Doorbell, Run, RunInfo
from ._validation import check_thread_key

if TYPE_CHECKING:
    from anyio.abc import TaskGroup, TaskStatus
    from structlog.typing import FilteringBoundLogger

__all__ = ["Agent", "SignalRuntime", "resolve_signal_inbox"]

Agent: TypeAlias = Callable[[Run], Awaitable[None]]
"""``async def agent(run: Run) -> None``: the code that runs while a process owns a thread."""

logger: FilteringBoundLogger = structlog.get_logger("signals")

_IF_ACTIVE = ("deliver", "queue", "discard", "reject")
_IF_IDLE = ("wake", "discard")
DOORBELL_EVENT = "signal.enqueued"
#: How many pending threads one recovery pass looks at (the longest-waiting first).
RECOVER_SCAN_LIMIT = 1000


def resolve_signal_inbox(pubsub: object, leases: LeaseProvider) -> SignalInbox:
    """The inbox the runtime uses when none is given.

    The pub/sub itself when it implements the inbox methods; a :class:`RedisSignalInbox` on the
    pub/sub's Redis connection when it has one (``RedisStreamsPubSub``); an in-memory inbox when
    the leases are process-local. Anything else would lose signals across processes, so it is a
    :class:`ConfigurationError`.
    """
    if is_signal_inbox(pubsub):
        return pubsub  # type: ignore[return-value]
    client = getattr(pubsub, "redis_client", None)
    if client is not None:
        import redis.asyncio

        if isinstance(client, redis.asyncio.Redis):
            from ._redis_inbox import RedisSignalInbox

            prefix = getattr(pubsub, "key_prefix", "pubsub")
            return RedisSignalInbox(client=client, key_prefix=f"{prefix}:signals")
    if isinstance(leases, NoopLeaseProvider | InMemoryLeaseProvider):
        return InMemorySignalInbox()
    raise ConfigurationError(
        "the lease provider is shared across processes but no shared inbox was found: pass "
        "inbox=RedisSignalInbox(...) (or another durable SignalInbox) to SignalRuntime"
    )


class _Chain:
    """The runs of one thread in this process, one after another, under one lease."""

    def __init__(self, thread_key: str, run_id: str) -> None:
        self.thread_key = thread_key
        self.run_id = run_id
        self.doorbell = Doorbell()
        self.token: int | None = None
        self.started_at = time.time()
        self.runs = 0

    def info(self) -> RunInfo:
        return RunInfo(self.run_id, self.thread_key, self.token, self.started_at, self.runs)

    async def on_doorbell(self, event: Event) -> None:
        self.doorbell.ring()


class SignalRuntime:
    """Receive signals for threads; run ``agent`` in exactly one process per thread.

    ``await runtime.send(thread_key, signal)`` either wakes the idle thread (this process wins
    the lease and runs the agent: outcome ``wake``) or hands the signal to the active run, here
    or in the owner process (``deliver``), per the ``if_active`` / ``if_idle`` policies.

    * Leases: ``leases=`` or, by structural detection, the pub/sub itself
      (:func:`leases.resolve_lease_provider`), falling back to the no-op provider.
    * Inbox: ``inbox=`` or :func:`resolve_signal_inbox`. Every accepted signal is in the inbox
      before ``send`` returns and stays there until a run has processed it.
    * The owner renews its lease every ``lease_ttl_ms / 3``; if the lease is lost the run is
      cancelled. Queued work is handed to the next run with ``transfer_lease``; the lease is
      released only when the inbox is empty.
    * A run that waits for follow-ups (``idle_wait_ms``) is woken by a doorbell event on the
      pub/sub topic ``topic_prefix + thread_key``.
    * Every ``recover_interval_ms`` (default: the lease TTL) the runtime looks for threads with
      pending signals and no owner (their owner died) and runs them.

    Use as ``async with SignalRuntime(...) as runtime``; leaving waits for active runs (a
    second cancellation cancels them; their leases then expire and the inbox keeps what they
    had not finished).
    """

    def __init__(
        self,
        *,
        pubsub: PubSub,
        agent: Agent,
        leases: LeaseProvider | None = None,
        inbox: SignalInbox | None = None,
        lease_ttl_ms: int = 15_000,
        idle_wait_ms: int = 0,
        recover_interval_ms: int | None = None,
        topic_prefix: str = "signals.thread.",
        runtime_id: str | None = None,
    ) -> None:
        if not callable(agent):
            raise TypeError("agent must be an async callable taking a Run")
        self.lease_ttl_ms = check_ttl_ms(lease_ttl_ms)
        if isinstance(idle_wait_ms, bool) or not isinstance(idle_wait_ms, int):
            raise TypeError(f"idle_wait_ms must be an int, got {type(idle_wait_ms).__name__}")
        if idle_wait_ms < 0:
            raise ValueError(f"idle_wait_ms must not be negative, got {idle_wait_ms}")
        self.idle_wait_ms = idle_wait_ms
        self.recover_interval_ms = check_ttl_ms(
            recover_interval_ms if recover_interval_ms is not None else lease_ttl_ms
        )
        if not isinstance(topic_prefix, str) or not topic_prefix:
            raise ValueError("topic_prefix must be a non-empty string")
        self.topic_prefix = topic_prefix
        self.pubsub = pubsub
        self.agent = agent
        self.leases: LeaseProvider = (
            leases if leases is not None else resolve_lease_provider(pubsub)
        )
        self.inbox: SignalInbox = inbox if inbox is not None else resolve_signal_inbox(
            pubsub, self.leases
        )
        self.runtime_id = runtime_id or f"rt-{uuid.uuid4().hex[:12]}"
        self._log: FilteringBoundLogger = logger.bind(runtime_id=self.runtime_id)
        self._chains: dict[str, _Chain] = {}
        self._locks: dict[str, anyio.Lock] = {}
        self._changed: anyio.Event | None = None
        self._tg: TaskGroup | None = None
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._tg is not None or self._closed:
            raise RuntimeClosedError("a SignalRuntime can be entered once")
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        tg.start_soon(self._recovery_loop, name="signals recovery")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        tg = self._tg
        if tg is None:
            return
        try:
            if exc_type is None:
                await self.wait_idle()
        finally:
            self._closed = True
            # Runs are done (or we are failing): stop the recovery loop and anything left.
            tg.cancel_scope.cancel()
            self._tg = None
            await tg.__aexit__(exc_type, exc, tb)

    def _require_open(self) -> TaskGroup:
        if self._tg is None or self._closed:
            raise RuntimeClosedError(
                "enter the runtime first: `async with SignalRuntime(...) as runtime`"
            )
        return self._tg

    # -- public API ------------------------------------------------------------------------

    def active_run(self, thread_key: str) -> RunInfo | None:
        """The run this process has on ``thread_key`` right now, or ``None``.

        Only this process's runs: another process may own the thread (ask the lease provider's
        ``get_lease_owner`` for that).
        """
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

        * The thread is active (a run here, or a lease owner elsewhere): ``if_active`` decides:
          ``deliver`` (to the active run), ``queue`` (for a run of its own after the active
          one), ``discard`` or ``reject``.
        * The thread is idle: ``if_idle="wake"`` starts a run in this process if it wins the
          lease (outcome ``wake``), else the signal goes to the winner (``deliver``);
          ``if_idle="discard"`` drops it.

        Returns once the signal is in the inbox and the owner was told; a sender that loses the
        election can exit right after. A signal id already accepted is not stored again (the
        outcome is reported as if it were). Backend errors propagate (never read as "idle").
        """
        check_thread_key(thread_key)
        if not isinstance(signal, Signal):
            signal = Signal(payload=signal)
        if if_active not in _IF_ACTIVE:
            raise ValueError(f"if_active must be one of {_IF_ACTIVE}, got {if_active!r}")
        if if_idle not in _IF_IDLE:
            raise ValueError(f"if_idle must be one of {_IF_IDLE}, got {if_idle!r}")
        self._require_open()
        log = self._log.bind(key=thread_key, signal_id=signal.id)

        mode: EntryMode = "queue" if if_active == "queue" else "deliver"
        if if_active in ("discard", "reject") or if_idle == "discard":
            # The policy depends on whether the thread is active: ask first.
            owner = await self._current_owner(thread_key)
            if owner is not None and if_active in ("discard", "reject"):
                if if_active == "discard":
                    log.debug("signal.discarded", reason="active", owner=owner)
                    return Delivery("discarded", signal.id, thread_key, owner=owner)
                log.debug("signal.rejected", reason="active", owner=owner)
                return Delivery("rejected", signal.id, thread_key, owner=owner)
            if owner is None and if_idle == "discard":
                log.debug("signal.discarded", reason="idle")
                return Delivery("discarded", signal.id, thread_key)

        # Into the inbox first, then claim the thread: whoever holds the lease at the moment our
        # claim fails checks the inbox after its release, so the signal is never stranded.
        fresh = await self.inbox.inbox_append(thread_key, signal, mode)
        queued_outcome: Outcome = "queued" if mode == "queue" else "deliver"
        async with self._lock(thread_key):
            chain = self._chains.get(thread_key)
            if chain is not None:
                # A local run: its end-of-run check takes this lock, so it will see the entry.
                chain.doorbell.ring()
                log.debug("signal.enqueued", owner=chain.run_id, mode=mode, duplicate=not fresh,
                          local=True)
                return Delivery(
                    queued_outcome, signal.id, thread_key, run_id=chain.run_id,
                    owner=chain.run_id,
                )
            run_id = self._new_run_id()
            result = await self.leases.acquire_lease(thread_key, run_id, self.lease_ttl_ms)
            if result.acquired:
                await self._start_chain(thread_key, run_id)
                log.info("signal.woke", owner=run_id, run_id=run_id, token=result.token,
                         duplicate=not fresh)
                return Delivery("wake", signal.id, thread_key, run_id=run_id, owner=run_id)
        self._forget_lock(thread_key)  # a sender-only process keeps no lock per remote thread
        await self._publish_doorbell(thread_key, signal)
        log.debug("signal.enqueued", owner=result.owner, mode=mode, duplicate=not fresh,
                  local=False)
        return Delivery(
            queued_outcome, signal.id, thread_key, run_id=result.owner, owner=result.owner
        )

    # -- routing ---------------------------------------------------------------------------

    def _lock(self, thread_key: str) -> anyio.Lock:
        lock = self._locks.get(thread_key)
        if lock is None:
            lock = self._locks[thread_key] = anyio.Lock()
        return lock

    def _forget_lock(self, thread_key: str) -> None:
        """Drop the thread's lock when no local chain, holder or waiter needs it."""
        if thread_key in self._chains:
            return
        lock = self._locks.get(thread_key)
        if lock is not None and not lock.locked() and lock.statistics().tasks_waiting == 0:
            del self._locks[thread_key]

    async def _current_owner(self, thread_key: str) -> str | None:
        chain = self._chains.get(thread_key)
        if chain is not None:
            return chain.run_id
        return await self.leases.get_lease_owner(thread_key)

    async def _publish_doorbell(self, thread_key: str, signal: Signal) -> None:
        await self.pubsub.publish(
            self.topic_prefix + thread_key,
            Event(DOORBELL_EVENT, {"thread_key": thread_key, "signal_id": signal.id}),
        )

    def _new_run_id(self) -> str:
        return f"run-{uuid.uuid4().hex}"

    # -- runs ------------------------------------------------------------------------------

    async def _start_chain(self, thread_key: str, run_id: str) -> None:
        """Start the run chain of a thread whose lease ``run_id`` holds (under its lock)."""
        await self._require_open().start(self._run_chain, thread_key, run_id)

    def _notify_changed(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def _unregister(self, chain: _Chain) -> None:
        if self._chains.get(chain.thread_key) is chain:
            del self._chains[chain.thread_key]
            self._notify_changed()

    async def _run_chain(
        self,
        thread_key: str,
        run_id: str,
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        chain = _Chain(thread_key, run_id)
        self._chains[thread_key] = chain
        sub: Subscription | None = None
        log = self._log.bind(key=thread_key)
        try:
            try:
                sub = await self.pubsub.subscribe(self.topic_prefix + thread_key, chain.on_doorbell)
            except Exception as exc:
                # Runs still poll the inbox while they wait, so this only slows follow-ups.
                log.warning("signals.doorbell_unavailable", error=repr(exc))
            task_status.started()
            try:
                await self._chain_loop(chain, log)
            except Exception as exc:
                # The lease is left to expire; recovery (here or elsewhere) resumes the inbox.
                log.error("run.chain_failed", owner=chain.run_id, run_id=chain.run_id,
                          error=repr(exc))
        finally:
            self._unregister(chain)
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                if sub is not None:
                    try:
                        await sub.close()
                    except Exception as exc:
                        log.debug("signals.doorbell_close_failed", error=repr(exc))
            self._forget_lock(thread_key)

    async def _chain_loop(self, chain: _Chain, log: FilteringBoundLogger) -> None:
        thread_key = chain.thread_key
        ttl = self.lease_ttl_ms
        while True:
            entries = await self.inbox.inbox_read(thread_key, limit=1)
            if entries:
                lost = await self._one_run(chain, entries[0], log)
                if lost:
                    return
            # The end-of-run decision holds the thread's lock, so a local sender either
            # appended before it (seen here) or finds no chain and claims the lease itself.
            async with self._lock(thread_key):
                if await self.inbox.inbox_pending_count(thread_key) > 0:
                    next_id = self._new_run_id()
                    if await self.leases.transfer_lease(thread_key, chain.run_id, next_id, ttl):
                        log.info("lease.handoff", owner=next_id, run_id=next_id,
                                 from_run_id=chain.run_id, token=chain.token)
                        chain.run_id, chain.token = next_id, None
                        continue
                    log.warning("lease.lost", owner=chain.run_id, run_id=chain.run_id,
                                token=chain.token, reason="transfer refused")
                    self._unregister(chain)
                    return
                await self.leases.release_lease(thread_key, chain.run_id)
                log.debug("lease.released", owner=chain.run_id, run_id=chain.run_id,
                          token=chain.token)
                # A remote sender may have appended and lost its claim to us just before the
                # release: look again, and claim the thread back if so.
                if await self.inbox.inbox_pending_count(thread_key) > 0:
                    next_id = self._new_run_id()
                    result = await self.leases.acquire_lease(thread_key, next_id, ttl)
                    if result.acquired:
                        log.info("lease.reacquired", owner=next_id, run_id=next_id,
                                 token=result.token)
                        chain.run_id, chain.token = next_id, result.token
                        continue
                self._unregister(chain)
                return

    async def _one_run(
        self, chain: _Chain, first: InboxEntry, log: FilteringBoundLogger
    ) -> bool:
        """Run the agent once; True when the lease was lost (the chain must stop)."""
        run_id = chain.run_id
        try:
            keeper = LeaseKeeper(
                self.leases, chain.thread_key, run_id, self.lease_ttl_ms, release_on_exit=False
            )
            async with keeper:
                chain.token = keeper.token
                chain.runs += 1
                run = Run(
                    run_id=run_id,
                    thread_key=chain.thread_key,
                    token=keeper.token,
                    inbox=self.inbox,
                    first=first,
                    doorbell=chain.doorbell,
                    idle_wait_s=self.idle_wait_ms / 1000,
                    poll_interval_s=min(POLL_INTERVAL_S, self.lease_ttl_ms / 3000),
                )
                rlog = log.bind(owner=run_id, run_id=run_id, token=keeper.token)
                rlog.info("run.started", signal_id=first.signal.id)
                try:
                    await self.agent(run)
                except Exception as exc:
                    # Commit what it consumed all the same: a poison signal must not loop.
                    rlog.error("run.failed", error=repr(exc), consumed=run.consumed)
                else:
                    rlog.info("run.finished", consumed=run.consumed)
        except LeaseNotAcquiredError as exc:
            log.warning("lease.lost", owner=run_id, run_id=run_id, reason="taken",
                        holder=exc.owner)
            self._unregister(chain)
            return True
        if keeper.lost:
            # Stop without committing the in-flight signal: the next owner processes it again.
            self._unregister(chain)
            log.warning("run.cancelled", owner=run_id, run_id=run_id, token=keeper.token,
                        reason=keeper.lost_reason)
            return True
        await run.commit_all()
        return False

    # -- recovery --------------------------------------------------------------------------

    async def _recovery_loop(self) -> None:
        while True:
            await anyio.sleep(self.recover_interval_ms / 1000)
            try:
                await self.recover()
            except Exception as exc:
                self._log.warning("signals.recovery_failed", error=repr(exc))

    async def recover(self) -> list[str]:
        """Run threads that have pending signals and no owner; returns the threads woken.

        The runtime calls this every ``recover_interval_ms``; call it yourself to recover at
        once (for example at the start of a process).
        """
        self._require_open()
        woken: list[str] = []
        for thread_key in await self.inbox.inbox_pending_threads(RECOVER_SCAN_LIMIT):
            if thread_key in self._chains:
                continue
            async with self._lock(thread_key):
                if thread_key in self._chains:
                    continue
                if await self.leases.get_lease_owner(thread_key) is None:
                    run_id = self._new_run_id()
                    result = await self.leases.acquire_lease(
                        thread_key, run_id, self.lease_ttl_ms
                    )
                    if result.acquired:
                        self._log.info("signals.recovered", key=thread_key, owner=run_id,
                                       run_id=run_id, token=result.token)
                        await self._start_chain(thread_key, run_id)
                        woken.append(thread_key)
            self._forget_lock(thread_key)
        return woken
