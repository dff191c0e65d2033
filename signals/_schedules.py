"""Schedules: a signal sent into a thread every ``every_ms`` or by a cron expression, each tick
exactly once across any number of processes (docs/time.md).

Nothing runs per schedule. A schedule is two stored things, both in the backend's core:

* its definition: a signal in the reserved, always paused thread :data:`SCHEDULES_THREAD`,
  in a lane named after the schedule (``merge="supersede"``: declaring it again with other
  settings replaces it);
* its next tick: a delayed signal in the target thread, with the id
  ``schedule:<schedule id>@<tick, Unix ms>``. Dedup by id makes each tick fire once, whichever
  processes declare the schedule or chain its ticks.

When a run hands out a tick, the runtime sends the next one (its id is the next tick time, so
two processes chaining the same tick store it once) and, with ``catch_up``, decides what a
tick that was missed (the next one is already due when it is handed out) does.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from _signal_leases.aio import unix_now
from _signal_leases.errors import BackendError, ClosedError
from _signal_leases.frozen import quick_init
from _signal_leases.validation import check_choice, check_identifier, check_optional_int
from signals._model import Signal

if TYPE_CHECKING:
    from _signal_leases.logs import Logger
    from signals.kit._store import KitStore

__all__ = [
    "SCHEDULES_THREAD", "TICK_PREFIX", "CatchUp", "Schedule", "Scheduler", "SchedulesMixin",
]

CatchUp: TypeAlias = Literal["latest", "all", "none"]
CATCH_UPS: tuple[CatchUp, ...] = ("latest", "all", "none")

#: The reserved thread that holds the schedules' definitions (paused: never run).
SCHEDULES_THREAD = "signals:schedules"
#: Tick signals' ids start with this.
TICK_PREFIX = "schedule:"


@quick_init
@dataclass(frozen=True, slots=True)
class Schedule:
    """A schedule as stored: ``signal`` is sent into ``thread_key`` at each tick, every
    ``every_ms`` milliseconds (from ``anchor``, Unix time) or by the ``cron`` expression in
    ``tz``; ``catch_up`` says what ticks missed while no worker ran do; ``next_at``: the next
    tick after now (Unix time)."""

    schedule_id: str
    thread_key: str
    signal: Signal
    every_ms: int | None
    cron: str | None
    tz: str
    catch_up: CatchUp
    anchor: float
    next_at: float

    def tick_after(self, at: float) -> float:
        """The first tick strictly after ``at`` (Unix time)."""
        return next_tick(self.every_ms, self.cron, self.tz, self.anchor, at)


def next_tick(every_ms: int | None, cron: str | None, tz: str, anchor: float,
              at: float) -> float:
    """The first tick strictly after ``at``: ``anchor + k * every_ms``, or cron's next in
    ``tz`` (croniter; daylight-saving changes as the zone has them)."""
    if every_ms is not None:
        step = every_ms / 1000
        k = max(1, int((at - anchor) // step) + 1)
        tick = anchor + k * step
        while tick <= at:  # float rounding
            tick += step
        return round(tick, 3)
    assert cron is not None
    from zoneinfo import ZoneInfo  # (first needed here: a sender that schedules nothing)

    zone = ZoneInfo(tz)
    base = datetime.fromtimestamp(at, zone)
    return float(_croniter()(cron, base).get_next(datetime).timestamp())


def _croniter() -> Any:
    """croniter, imported when first needed (a sender that schedules nothing never pays)."""
    from croniter import croniter  # type: ignore[import-untyped]

    return croniter


def check_schedule(every_ms: int | None, cron: str | None, tz: str, catch_up: str) -> None:
    """``ValueError``/``TypeError`` naming the argument that is wrong."""
    check_optional_int("every_ms", every_ms)
    if (every_ms is None) == (cron is None):
        raise ValueError("give exactly one of every_ms=... and cron=...")
    if not isinstance(tz, str):
        raise TypeError(f"tz must be a time zone name like 'Europe/Paris', got {tz!r}")
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"tz={tz!r} is not a known time zone (like 'Europe/Paris')") from None
    check_choice("catch_up", catch_up, CATCH_UPS)
    if cron is not None:
        if not isinstance(cron, str):
            raise TypeError(f"cron must be a cron expression string, got {cron!r}")
        if not _croniter().is_valid(cron):
            raise ValueError(f"cron={cron!r} is not a valid cron expression "
                             "(like '0 9 * * *': minute hour day month weekday)")


def tick_id(schedule_id: str, tick: float) -> str:
    return f"{TICK_PREFIX}{schedule_id}@{round(tick * 1000)}"


def parse_tick(signal_id: str) -> tuple[str, float] | None:
    """``(schedule id, tick)`` of a tick signal's id, else ``None``."""
    if not signal_id.startswith(TICK_PREFIX):
        return None
    schedule_id, _, ms = signal_id[len(TICK_PREFIX):].rpartition("@")
    if not schedule_id or not ms.isdigit():
        return None
    return schedule_id, int(ms) / 1000


class Scheduler:
    """The runtime's schedules over its kit: declare, list, remove, and chain ticks."""

    def __init__(self, kit: KitStore, send: Any, cancel: Any, log: Any) -> None:
        self._kit = kit
        self._send = send  # the runtime's send (routing, due timers, notices)
        self._cancel = cancel
        self._log = log

    async def schedule(self, schedule_id: str, thread_key: str, signal: Signal | Any, *,
                       every_ms: int | None, cron: str | None, tz: str, catch_up: str) -> Schedule:
        check_identifier("schedule_id", schedule_id)
        check_identifier("thread_key", thread_key)
        if not isinstance(signal, Signal):
            signal = Signal(signal)
        if signal.not_before is not None or signal.expires_at is not None:
            raise ValueError("a scheduled signal cannot have not_before or expires_at: the "
                             "schedule sets when it comes")
        check_schedule(every_ms, cron, tz, catch_up)
        core = self._kit.core
        await core.pause(SCHEDULES_THREAD, True)  # the definitions' thread never runs
        spec = {"thread_key": thread_key, "signal": _template(signal), "every_ms": every_ms,
                "cron": cron, "tz": tz, "catch_up": catch_up}
        found = (await self._definitions()).get(schedule_id)
        if found is not None and _spec(found) == spec:
            current = found  # declared again as it is (every worker does at start)
        else:
            if found is not None:
                await self._withdraw_ticks(found)
            anchor = round(unix_now(), 3)
            definition = Signal({**spec, "schedule_id": schedule_id, "anchor": anchor},
                                type="schedule", id=f"{schedule_id}#{uuid.uuid4().hex[:12]}",
                                lane=schedule_id, merge="supersede")
            await core.accept(SCHEDULES_THREAD, definition, "queue")
            current = _schedule(definition.payload)
        await self._send_tick(current, current.tick_after(unix_now()))
        return current.public()

    async def unschedule(self, schedule_id: str) -> bool:
        check_identifier("schedule_id", schedule_id)
        found = (await self._definitions()).get(schedule_id)
        if found is None:
            return False
        await self._kit.core.withdraw(SCHEDULES_THREAD, [found.signal_id], held=True)
        await self._withdraw_ticks(found)
        return True

    async def schedules(self) -> list[Schedule]:
        return sorted((d.public() for d in await self._definitions_list()),
                      key=lambda s: s.schedule_id)

    async def on_tick(self, thread_key: str, signal: Signal) -> bool:
        """A run is about to hand out ``signal``: for a tick, send the next one; ``False``
        when the tick is to be skipped (``catch_up="none"`` and the tick was missed)."""
        parsed = parse_tick(signal.id)
        if parsed is None:
            return True
        schedule_id, tick = parsed
        found = (await self._definitions()).get(schedule_id)
        if found is None or found.thread_key != thread_key:
            return True  # unscheduled (or moved) since: this tick was already stored
        now = unix_now()
        following = found.tick_after(tick)
        missed = following <= now
        if found.catch_up != "all":
            following = found.tick_after(now)
        await self._send_tick(found, following)
        if (await self._definitions()).get(schedule_id) is None:  # unscheduled meanwhile
            await self._cancel(thread_key, [tick_id(schedule_id, following)])
        return not (missed and found.catch_up == "none")

    # -- parts ------------------------------------------------------------------------------

    async def _send_tick(self, schedule: Schedule, at: float) -> None:
        tick = schedule.signal.replace(id=tick_id(schedule.schedule_id, at), not_before=at,
                                       created_at=unix_now())
        await self._send(schedule.thread_key, tick)

    async def _withdraw_ticks(self, schedule: _Stored) -> None:
        prefix = f"{TICK_PREFIX}{schedule.schedule_id}@"
        pending = await self._kit.core.entries(schedule.thread_key, limit=10_000)
        ids = [e.signal.id for e in pending if e.signal.id.startswith(prefix)]
        if ids:
            await self._cancel(schedule.thread_key, ids)

    async def _definitions_list(self) -> list[_Stored]:
        entries = await self._kit.core.entries(SCHEDULES_THREAD, limit=100_000)
        out: list[_Stored] = []
        for e in entries:
            try:
                out.append(_schedule(e.signal.payload, e.signal.id))
            except (KeyError, TypeError, ValueError) as exc:
                self._log.warning("schedule.unreadable", signal_id=e.signal.id, error=repr(exc))
        return out

    async def _definitions(self) -> dict[str, _Stored]:
        return {s.schedule_id: s for s in await self._definitions_list()}


@quick_init
@dataclass(frozen=True, slots=True)
class _Stored(Schedule):
    signal_id: str = ""  # of the definition

    def public(self) -> Schedule:
        return Schedule(self.schedule_id, self.thread_key, self.signal, self.every_ms,
                        self.cron, self.tz, self.catch_up, self.anchor, self.next_at)


def _template(signal: Signal) -> dict[str, Any]:
    out = signal.to_dict()
    out.pop("id", None)
    out.pop("created_at", None)
    return out


def _spec(s: Schedule) -> dict[str, Any]:
    return {"thread_key": s.thread_key, "signal": _template(s.signal), "every_ms": s.every_ms,
            "cron": s.cron, "tz": s.tz, "catch_up": s.catch_up}


def _schedule(payload: dict[str, Any], signal_id: str = "") -> _Stored:
    template = dict(payload["signal"])
    signal = Signal.from_dict({**template, "id": "template", "created_at": 0.0})
    anchor = float(payload["anchor"])
    every_ms, cron, tz = payload.get("every_ms"), payload.get("cron"), payload.get("tz", "UTC")
    return _Stored(payload["schedule_id"], payload["thread_key"], signal, every_ms, cron, tz,
                   payload.get("catch_up", "latest"), anchor,
                   next_tick(every_ms, cron, tz, anchor, unix_now()), signal_id)


class SchedulesMixin:
    """The runtime's schedule calls (a mixin of :class:`~signals.SignalRuntime`)."""

    _scheduler: Scheduler | None
    _log: Logger
    send: Any  # the runtime's (see SignalRuntime): what a tick sends and cancels with
    cancel: Any
    _kit_open: Callable[[], KitStore]

    async def schedule(
        self, schedule_id: str, thread_key: str, signal: Signal | Any, *,
        every_ms: int | None = None, cron: str | None = None, tz: str = "UTC",
        catch_up: CatchUp = "latest",
    ) -> Schedule:
        """Send ``signal`` into ``thread_key`` every ``every_ms`` milliseconds or by the
        ``cron`` expression (croniter: ``"0 9 * * *"``, in the time zone ``tz``), each tick
        exactly once across every process; durable. Declaring the same ``schedule_id`` again
        with the same settings changes nothing (every worker can declare it at start); with
        other settings it replaces the schedule. ``catch_up``: what ticks missed while no
        worker ran do: ``latest`` fires one, ``all`` fires each, ``none`` skips them. A bad
        cron expression, time zone or ``catch_up`` is a ``ValueError`` naming it."""
        return await self._schedules().schedule(
            schedule_id, thread_key, signal, every_ms=every_ms, cron=cron, tz=tz,
            catch_up=catch_up)

    async def unschedule(self, schedule_id: str) -> bool:
        """Remove a schedule and its pending tick; ``False`` when there was none. A tick a run
        already has finishes."""
        return await self._schedules().unschedule(schedule_id)

    async def schedules(self) -> list[Schedule]:
        """Every schedule, by id."""
        return await self._schedules().schedules()

    def _schedules(self) -> Scheduler:
        kit = self._kit_open()
        if self._scheduler is None:
            self._scheduler = Scheduler(kit, self.send, self.cancel, self._log)
        return self._scheduler

    async def _on_tick(self, thread_key: str, signal: Signal) -> bool:
        try:
            return await self._schedules().on_tick(thread_key, signal)
        except (ClosedError, BackendError) as exc:
            # The next tick is declared again by every schedule() at a worker's start.
            self._log.warning("schedule.chain_failed", key=thread_key, signal_id=signal.id,
                              error=repr(exc))
            return True
