"""Optional capabilities of a :class:`~signals.kit.SignalCore`: extra structural methods that
replace one of :class:`~signals.kit.KitStore`'s derivations with a native path.

* :class:`NoticeChannel` (``notify``, ``listen``): wake-up calls on the backend's own channel.
  Without it, notices travel over the pub/sub (one subscription per runtime process).
* :class:`OutputStreams` (``emit``, ``stream_read``, ``stream_tail``, ``follower``): the
  threads' output streams, with lifecycle parts written in the same step as the inbox change.
  Without it, parts travel over the pub/sub (a topic per thread; cursors are event ids, and a
  stream keeps what the pub/sub retains).
* :class:`RuntimeRegistry`: which runtimes are alive (host, pid) and which threads each one
  owns. Without it, a runtime's presence is a lease (``~runtime:<id>``, its info as owner) and
  ownership comes from the leases.
* :class:`FusedRouting` (``fuses_with``, ``route``, ``claim``, ``release_if_idle``,
  ``abort``): the inbox step and the lease step in one atomic call, for the lease provider the
  core was built with. Without it, the runtime takes leases around the core's calls: more
  round trips, and a window in which a stale run can still take a signal (its next call is
  fenced by the token, and the signal is handed out again).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, TypeAlias

from _signal_leases.frozen import quick_init
from signals._model import EntryMode, Signal, StreamPart
from signals.kit._core import NO_LIMITS, Accepted, InboxEntry, Limits

if TYPE_CHECKING:
    from leases import LeaseProvider

__all__ = [
    "CARRY_LIMIT",
    "Claim",
    "Claimed",
    "Follower",
    "FusedRouting",
    "Notice",
    "NoticeChannel",
    "NoticeKind",
    "OutputStreams",
    "PartIn",
    "Routed",
    "RuntimeInfo",
    "RuntimeRegistry",
    "acked_data",
    "has",
    "received_data",
]

#: Fused cores deliver a ``deliver`` signal up to this size (encoded) to the owner's run in
#: the same step as accepting it, and carry it in the notice: no inbox read.
CARRY_LIMIT = 16 * 1024

NoticeKind: TypeAlias = Literal["signal", "work", "due", "pause", "abort", "resync"]
"""``signal``: the thread has new input for its run. ``work``: a thread has pending work and no
owner. ``due``: a thread has a signal due at ``reason`` (Unix time): wake the timer by then.
``pause``: the thread was paused: its run hands out nothing more. ``abort``: cancel a run.
``resync``: the listener (re)connected and may have missed notices: look at everything
again."""


@quick_init
@dataclass(frozen=True, slots=True)
class Notice:
    """A wake-up call delivered to a listening runtime (see :data:`NoticeKind`). ``entry``:
    a ``signal`` notice may carry the entry itself, already carried to ``run_id``."""

    kind: NoticeKind
    thread_key: str = ""
    run_id: str | None = None
    reason: str | None = None
    entry: InboxEntry | None = None


@quick_init
@dataclass(frozen=True, slots=True)
class RuntimeInfo:
    """A runtime in the registry. ``alive`` is false once its presence expired."""

    runtime_id: str
    host: str
    pid: int
    started_at: float
    worker: bool
    alive: bool = True


@quick_init
@dataclass(frozen=True, slots=True)
class PartIn:
    """A part to append to a thread's output stream (``data``: JSON text or ``None``)."""

    kind: str
    run_id: str
    signal_id: str | None = None
    data: str | None = None


class Follower(Protocol):
    """A process-wide watcher of output streams (see :meth:`OutputStreams.follower`)."""

    async def wait(self, thread_key: str, after: str | None) -> list[StreamPart]:
        """Wait for parts after ``after`` (``None``: from the start) and return them (an
        empty list is allowed: read again). Many waiters share one watcher."""
        ...


def received_data(attempt: int) -> str:
    """The JSON of a ``signal.received`` part."""
    return f'{{"attempt":{attempt:d}}}'


def acked_data(result: str | None) -> str | None:
    """The JSON of a ``signal.acked`` part (``result``: the ack's, its JSON already)."""
    return None if result is None else f'{{"result":{result}}}'


@quick_init
@dataclass(frozen=True, slots=True)
class Claim:
    """Take the thread's lease for ``owner`` (a run id of ``runtime_id``) if it is free."""

    owner: str
    ttl_ms: int
    session: str | None
    runtime_id: str


@quick_init
@dataclass(frozen=True, slots=True)
class Routed:
    """What a fused :meth:`FusedRouting.route` did: ``accepted`` (the core's answer), then
    ``owner`` (the live lease holder after the call; ``None``: none), ``claimed`` (the caller's
    claim won; ``token`` is its fencing token), ``carried`` (the entry was carried to the
    owner's run in the notice), ``workers`` (how many worker runtimes heard the ``work``
    notice, for a core that can tell; ``None``: unknown)."""

    accepted: Accepted
    owner: str | None = None
    claimed: bool = False
    token: int | None = None
    carried: bool = False
    workers: int | None = None


@quick_init
@dataclass(frozen=True, slots=True)
class Claimed:
    """What a fused :meth:`FusedRouting.claim` did: ``claimed`` (``token``: its fencing
    token), or ``owner`` (a live holder: the thread stays indexed until its lease would
    expire), or ``empty`` (no ready work, or paused: the thread left the index or waits for
    its next due time: ``next_due``, Unix time)."""

    claimed: bool = False
    owner: str | None = None
    token: int | None = None
    empty: bool = False
    next_due: float | None = None


class NoticeChannel(Protocol):
    """Optional: notices on the backend's own channel (see the module docstring)."""

    async def notify(self, runtime_id: str | None, notice: Notice) -> None:
        """Send ``notice`` to ``runtime_id`` (``None``: every worker); at most once."""
        ...

    def listen(
        self, runtime_id: str, handler: Callable[[Notice], None], *, worker: bool
    ) -> AbstractAsyncContextManager[None]:
        """Deliver notices for ``runtime_id`` (and, if ``worker``, the workers' notices) to
        ``handler`` while entered; a ``resync`` notice after every (re)connection."""
        ...


class OutputStreams(Protocol):
    """Optional: native output streams (see the module docstring). A core with it writes
    ``signal.received``, ``signal.acked``, ``signal.dead_lettered``, ``signal.cancelled``,
    ``signal.superseded``, ``signal.expired`` and ``signal.dropped`` parts itself, in the
    same step as the inbox change."""

    async def emit(self, thread_key: str, parts: Sequence[PartIn]) -> list[str]:
        """Append ``parts`` in order; their cursors."""
        ...

    async def stream_read(
        self, thread_key: str, *, after: str | None = None, limit: int = 100
    ) -> list[StreamPart]:
        """The parts after ``after`` (``None``: from the oldest retained); a cursor older
        than the retention raises :class:`~signals.CursorExpiredError`."""
        ...

    async def stream_tail(self, thread_key: str) -> str | None:
        """The cursor of the newest part (``None``: empty)."""
        ...

    def follower(self) -> AbstractAsyncContextManager[Follower]:
        """One watcher for every stream reader of this process."""
        ...


class RuntimeRegistry(Protocol):
    """Optional: the runtimes and the threads each one owns (see the module docstring)."""

    async def register_runtime(self, info: RuntimeInfo, ttl_ms: int) -> None: ...

    async def refresh_runtime(self, runtime_id: str, ttl_ms: int) -> bool:
        """Keep ``runtime_id`` alive; ``False`` if it was already taken for dead."""
        ...

    async def unregister_runtime(self, runtime_id: str) -> None: ...

    async def track_threads(
        self, runtime_id: str, *, add: Sequence[str] = (), remove: Sequence[str] = ()
    ) -> None: ...

    async def runtimes(self) -> list[RuntimeInfo]: ...

    async def runtime_threads(self, runtime_id: str) -> list[str]: ...


class FusedRouting(Protocol):
    """Optional: the inbox and the lease in one atomic step (see the module docstring).
    Used only when ``fuses_with(leases)`` is true for the runtime's lease provider."""

    def fuses_with(self, leases: LeaseProvider) -> bool: ...

    async def route(
        self, thread_key: str, signal: Signal, mode: EntryMode, *, claim: Claim | None,
        sender: str | None, wake_workers: bool, limits: Limits = NO_LIMITS,
        interrupt: bool = False,
    ) -> Routed:
        """``accept``, then for a fresh signal in the same step: with a live owner, notify its
        runtime (unless it is ``sender``), carrying a small ``deliver`` entry to its run;
        else take the lease for ``claim`` (not for a paused thread); else index the thread and
        (``wake_workers``) notify the workers. A signal not due yet claims nothing.

        ``interrupt`` (``send(if_active="interrupt")``; passed only when true): a ready
        signal for a live owner aborts that owner in the same step, as
        :meth:`abort` does (``abort`` notice, reason ``"interrupt"``), and is neither carried
        to it nor announced to it: the next run takes it."""
        ...

    async def claim(self, thread_key: str, claim: Claim) -> Claimed:
        """Take the lease for ``claim`` if the thread has ready work, is not paused and has no
        live owner; a live owner defers the thread until its lease would expire (and, when
        the thread has ready work, the owner's runtime gets a ``signal`` notice)."""
        ...

    async def release_if_idle(self, thread_key: str, owner: str, runtime_id: str) -> bool:
        """Release ``owner``'s lease only if the thread has no ready work (or is paused)."""
        ...

    async def abort(
        self, thread_key: str, run_id: str | None, *, reason: str, clear: bool
    ) -> str | None:
        """Abort ``run_id`` (or the live owner) only if it holds the lease, atomically: mark
        it, notify its runtime, and with ``clear`` withdraw every pending signal."""
        ...


def has(core: object, *names: str) -> bool:
    """True when ``core`` has every method named (a capability is present)."""
    return all(callable(getattr(core, name, None)) for name in names)
