"""The runs of one thread in this process, one after another, under one lease.

A chain is the only task a thread costs while it is active: it runs the agent inline, then
either releases the thread (no work ready) or hands the lease to the next run with
``transfer_lease`` (the key is never free in between). Its run waits for input on a
:class:`~signals._run.Doorbell`, rung by local senders and by the process's one notice
listener: no polling, no subscription, no timer of its own.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

import anyio

from _signal_leases.aio import loop_time, retry_unavailable
from _signal_leases.encoding import compact_json
from _signal_leases.logs import get_logger
from _signal_leases.validation import check_identifier
from signals._doorbell import Doorbell
from signals._model import RunInfo
from signals._run import Reducer, Run
from signals._telemetry import Telemetry
from signals.kit._capabilities import PartIn
from signals.kit._core import RunRef

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from _signal_leases.logs import Logger
    from leases import HeldLease
    from signals._model import Signal
    from signals.kit._core import InboxEntry
    from signals.kit._store import KitStore

__all__ = ["Chain", "ChainSettings", "RunEnd", "check_reducers"]

logger = get_logger("signals")

RunEnd: TypeAlias = Literal["finished", "failed", "cancelled"]


class ChainSettings:
    """What every chain of a runtime shares."""

    def __init__(
        self,
        *,
        agent: Callable[[Run], Awaitable[None]],
        store: KitStore,
        idle_wait_s: float,
        max_attempts: int,
        max_bytes: int,
        run_timeout_s: float | None,
        reducers: Mapping[str, Reducer],
        log: Logger,
        on_tick: Callable[[str, Signal], Awaitable[bool]] | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.agent = agent
        self.on_tick = on_tick
        self.telemetry = telemetry
        self.store = store
        self.idle_wait_s = idle_wait_s
        self.max_attempts = max_attempts
        self.max_bytes = max_bytes
        self.run_timeout_s = run_timeout_s
        self.reducers = reducers
        self.log = log


class Chain:
    """The active runs of one thread in this process (see the module docstring)."""

    def __init__(self, settings: ChainSettings, lease: HeldLease, *,
                 taken_over: bool = False) -> None:
        self.settings = settings
        self.taken_over = taken_over  # claimed by recovery: its first run's metrics say so
        self.thread_key = lease.key
        self.lease = lease
        self.doorbell = Doorbell()
        self.started_at = time.time()
        self.runs = 0
        self.run: Run | None = None
        self._cancel_reason: str | None = None
        self._interrupted = False  # the previous run ended by an interrupt
        self._winding_down = False  # the runtime is leaving: runs wait for nothing new
        # (run id, signal id): carried by a notice to a run that had not started or had ended;
        # see _settle_carried
        self._carried: list[tuple[str, str]] = []

    @property
    def run_id(self) -> str:
        return self.lease.owner

    def info(self) -> RunInfo:
        return RunInfo(self.run_id, self.thread_key, self.lease.token, self.started_at, self.runs)

    def offer(self, entry: InboxEntry, run_id: str | None) -> None:
        """A notice carried ``entry`` to ``run_id``: hand it to that run, or ring."""
        run = self.run
        if run is not None and not run.ended and run.run_id == run_id == self.run_id:
            run.offer(entry)
            return
        if run_id is not None:
            self._carried.append((run_id, entry.signal.id))
        self.doorbell.ring()

    def wind_down(self) -> None:
        """The runtime is leaving: the current run waits for nothing new."""
        self._winding_down = True
        if self.run is not None:
            self.run.wind_down()

    def pause(self) -> None:
        """The thread was paused: the current run hands out nothing more."""
        if self.run is not None:
            self.run.pause()

    def cancel_run(self, reason: str, run_id: str | None = None) -> bool:
        """Cancel the current run (only if it is ``run_id``, when given); the chain goes on."""
        if run_id is not None and run_id != self.run_id:
            return False
        self._cancel_reason = reason
        self.lease.cancel_guards(reason)
        return True

    async def serve(self, on_end: Callable[[Chain], None]) -> None:
        """Run the agent until the thread is released or its lease lost."""
        try:
            while True:
                end, more = await self._one_run()
                if self._lost() or self._cancel_reason == "shutdown":
                    return
                next_lease = await self._finish(more)
                if next_lease is None:
                    if self._lost():
                        self._log().warning("lease.lost", reason=self.lease.lost_reason)
                    return
                self.settings.log.info(
                    "lease.handoff", key=self.thread_key, from_run_id=self.run_id,
                    run_id=next_lease.owner, token=next_lease.token, after=end,
                )
                self.lease = next_lease
        except Exception as exc:
            self._log().error("run.chain_failed", error=repr(exc))
            await self._give_up()
        finally:
            await self._settle_carried(None)
            on_end(self)

    async def _finish(self, more: bool) -> HeldLease | None:
        """``store.finish``, retried through outages while the lease holds."""
        lease = self.lease
        result: HeldLease | None = None  # stays None if the lease is lost while retrying
        with lease.guard():
            result = await retry_unavailable(
                lambda: self.settings.store.finish(lease, more=more)
            )
        return result

    def _lost(self) -> bool:
        return self.lease.lost

    async def _give_up(self) -> None:
        """Release the thread after an unexpected error, so another run (here after recovery,
        or elsewhere) can go on with its inbox; the signals stay there."""
        heartbeat = self.settings.store.heartbeat
        if heartbeat is None or self.lease.lost:
            return
        with anyio.move_on_after(2, shield=True):
            try:
                await heartbeat.release(self.lease)
            except Exception as exc:
                self._log().warning("lease.release_failed", error=repr(exc))

    def _log(self) -> Logger:
        return self.settings.log.bind(
            key=self.thread_key, run_id=self.run_id, owner=self.run_id, token=self.lease.token
        )

    def _fenced(self) -> None:
        heartbeat = self.settings.store.heartbeat
        if heartbeat is not None:
            heartbeat.lose(self.lease, "taken over by another run")

    def _dead_lettered(self, signal_id: str) -> None:
        self._log().warning("signal.dead_lettered", signal_id=signal_id,
                            attempts=self.settings.max_attempts)
        Telemetry.event("signal.dead_lettered", signal_id=signal_id, thread_key=self.thread_key)
        Telemetry.count("dead_letters")

    async def _one_run(self) -> tuple[RunEnd, bool]:
        s = self.settings
        lease = self.lease
        self.runs += 1
        interrupted, self._interrupted = self._interrupted, False
        self._cancel_reason = None
        run = self.run = Run(
            run_id=lease.owner, thread_key=self.thread_key, token=lease.token,
            store=s.store, doorbell=self.doorbell, idle_wait_s=s.idle_wait_s,
            max_attempts=s.max_attempts, max_bytes=s.max_bytes, reducers=s.reducers,
            on_dead_letter=self._dead_lettered, on_fenced=self._fenced, on_tick=s.on_tick,
            telemetry=s.telemetry, taken_over=self.taken_over and self.runs == 1,
        )
        run.interrupted = interrupted
        if self._winding_down:
            run.wind_down()
        await self._settle_carried(run)
        log = self._log()
        log.info("run.started", runs=self.runs, interrupted=interrupted)
        end: RunEnd = "finished"
        error: str | None = None
        exc_type = ""
        Telemetry.count("active_runs")
        try:
            with lease.guard() as scope:
                if s.run_timeout_s is not None:
                    scope.deadline = loop_time() + s.run_timeout_s
                try:
                    await self._part(run, "run.started",
                                     {"runs": self.runs, "interrupted": interrupted})
                    await run.prime()
                    await s.agent(run)
                    await run.ack_all()
                except Exception as exc:
                    exc_type = type(exc).__name__
                    end, error = "failed", f"{exc_type}: {exc}"
        finally:
            Telemetry.count("active_runs", -1)
        run.ended = True  # from now on, what a notice carries to it is settled by the chain
        if scope.cancelled_caught or (scope.cancel_called and end == "finished" and run.unacked):
            end = "cancelled"
        reason = (
            f"lost lease ({lease.lost_reason})" if lease.lost
            else self._cancel_reason or ("timeout" if end == "cancelled" else None)
        )
        more = run.more
        run.end_spans(error if end == "failed" else (f"cancelled: {reason}"
                                                     if end == "cancelled" else None))
        if end == "cancelled" and reason is not None:
            Telemetry.event(f"run.{'interrupted' if reason == 'interrupt' else 'cancelled'}",
                            reason=reason, run_id=run.run_id)
        if end == "finished":
            await self._settle(run, None)
        fields = {"signals": run.consumed, "signal_ids": list(run.first_ids)}
        if end == "failed":
            log.error("run.failed", error=error, unacked=len(run.unacked), **fields)
            await self._settle(run, error or "")
            message = (error or "").partition(": ")[2]
            await self._part(run, "run.failed", {"error_type": exc_type, "message": message})
        elif end == "cancelled":
            self._interrupted = reason == "interrupt"
            # An interrupt, an abort or a shutdown is what someone asked for: info; anything
            # else (a timeout, a lost lease) is a warning.
            asked = reason in ("interrupt", "shutdown") or (reason or "").startswith("abort")
            level = log.info if asked else log.warning
            level("run.cancelled", reason=reason, unacked=len(run.unacked), **fields)
            await self._settle(run, f"cancelled: {reason}")
            await self._part(run, "run.cancelled", {"reason": reason})
        else:
            log.info("run.finished", **fields)
            await self._part(run, "run.finished", {"signals": run.consumed})
        return end, more or end != "finished"

    async def _settle(self, run: Run, error: str | None) -> None:
        """What the run leaves: the signals it handed out and did not acknowledge (a failed
        or cancelled run: ``error``), and those it took but never handed out (their attempt
        is given back). Bounded and best effort: a run that lost its lease writes nothing."""
        failed = run.failed_ids() if error is not None else []
        returned = run.unhanded()
        run.forget()
        if self.lease.lost or not (failed or returned):
            return
        with anyio.move_on_after(1, shield=True):
            try:
                await self.settings.store.settle(
                    self.thread_key, RunRef(run.run_id, run.token), failed=failed,
                    returned=returned, error=error,
                )
            except Exception as exc:
                self._log().debug("signals.settle_failed", error=repr(exc))

    async def _settle_carried(self, run: Run | None) -> None:
        """Entries a notice carried to a run of this chain outside that run's life: those
        for ``run`` (about to start) are its own; the rest were never handed out, so the
        chain's current run gives their attempt back."""
        carried, self._carried = self._carried, []
        others: list[str] = []
        for rid, sid in carried:
            if run is not None and rid == run.run_id:
                run.note_carried(sid)
            else:
                others.append(sid)
        if not others or self.lease.lost:
            return
        with anyio.move_on_after(1, shield=True):
            try:
                await self.settings.store.settle(
                    self.thread_key, RunRef(self.lease.owner, self.lease.token), returned=others
                )
            except Exception as exc:
                self._log().debug("signals.settle_failed", error=repr(exc))

    async def _part(self, run: Run, kind: str, data: dict[str, Any]) -> None:
        """Write a lifecycle part (best effort, bounded: a lifecycle part never holds up a
        run, and one that cannot be written is logged)."""
        part = PartIn(kind, run.run_id, None, compact_json(data))
        with anyio.move_on_after(1, shield=True):
            try:
                await self.settings.store.emit(self.thread_key, [part])
            except Exception as exc:
                self._log().warning("signals.part_failed", kind=kind, error=repr(exc))


def check_reducers(reducers: Mapping[str, Reducer] | None) -> dict[str, Reducer]:
    if reducers is None:
        return {}
    if not isinstance(reducers, Mapping):
        raise TypeError(f"reducers must be a dict of lane -> function, got "
                        f"{type(reducers).__name__}")
    for lane, fn in reducers.items():
        check_identifier("reducers lane", lane)
        if not callable(fn):
            raise TypeError(f"reducers[{lane!r}] must be a function taking a list of signals")
    return dict(reducers)
