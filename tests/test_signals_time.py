"""Time as an input (docs/time.md): delays, expiry, debounce and schedules.

* virtual time (trio's ``MockClock``, which ``unix_now`` follows) for the runtime's timing on
  the memory backend: nothing here waits for real;
* cron ticks across a daylight-saving change, on the tick function itself;
* real processes on one SQLite file: three workers declaring one schedule fire each tick once,
  and ``unschedule`` stops it; a delay that comes due while every process is down.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import anyio
import pytest
from trio.testing import MockClock

from _signal_leases.aio import unix_now
from pubsub import InMemoryPubSub, SQLitePubSub
from signals import Run, Signal, SignalRuntime
from signals._schedules import next_tick

ROOT = Path(__file__).resolve().parent.parent


def virtual(fn: Any) -> Any:
    """Run ``fn()`` on trio with a clock that jumps ahead whenever every task waits."""
    return anyio.run(fn, backend="trio", backend_options={"clock": MockClock(autojump_threshold=0)})


class Seen:
    def __init__(self) -> None:
        self.got: list[tuple[str, float, Any]] = []

    async def __call__(self, run: Run) -> None:
        async for signal in run:
            self.got.append((signal.id, unix_now(), signal.payload))
            await run.ack(signal)


def fold(signals: list[Signal]) -> list[Any]:
    return [s.payload for s in signals]


def test_delay_expiry_and_debounce_in_virtual_time() -> None:
    async def main() -> dict[str, Any]:
        seen = Seen()
        async with InMemoryPubSub() as ps, SignalRuntime(pubsub=ps, agent=seen,
                                                         reducers={"k": fold}) as rt:
            t0 = unix_now()
            d = await rt.send("d", Signal(1, id="in-an-hour"), delay_ms=3_600_000)
            receipt = await rt.receipt("d", "in-an-hour")
            await rt.pause("e")
            await rt.send("e", Signal(2, id="stale"), expires_in_ms=5_000)
            for n in range(5):
                await rt.send("k", Signal(n, id=f"k{n}", lane="k", merge="coalesce",
                                          debounce_ms=2_000, max_wait_ms=60_000))
                await anyio.sleep(1)
            last = unix_now()
            await anyio.sleep(10)
            await rt.resume("e")
            await anyio.sleep(3_600)
            expired = await rt.receipt("e", "stale")
            return {"outcome": d.outcome, "receipt": receipt and receipt.status,
                    "got": {sid: round(at - t0, 1) for sid, at, _ in seen.got},
                    "debounced": [(sid, round(at - last, 1), p) for sid, at, p in seen.got
                                  if sid.startswith("k")],
                    "expired": expired and expired.status}

    out = virtual(main)
    assert out["outcome"] == "scheduled" and out["receipt"] == "scheduled"
    assert 3_600 <= out["got"]["in-an-hour"] <= 3_601, out
    assert out["expired"] == "expired" and "stale" not in out["got"], out
    assert out["debounced"] == [("k4", 1.0, [0, 1, 2, 3, 4])], out  # quiet 2 s after k4


def test_max_wait_bounds_a_debounce_in_virtual_time() -> None:
    async def main() -> list[tuple[str, float]]:
        seen = Seen()
        async with InMemoryPubSub() as ps, SignalRuntime(pubsub=ps, agent=seen,
                                                         reducers={"k": fold}) as rt:
            t0 = unix_now()
            for n in range(8):  # never quiet for 2 s: max_wait_ms hands the lane out
                await rt.send("k", Signal(n, id=f"k{n}", lane="k", merge="coalesce",
                                          debounce_ms=2_000, max_wait_ms=5_000))
                await anyio.sleep(1)
            await anyio.sleep(10)
            return [(sid, round(at - t0, 1)) for sid, at, _ in seen.got]

    got = virtual(main)
    assert got[0][0] in ("k4", "k5") and 5.0 <= got[0][1] <= 5.1, got


def test_a_schedule_ticks_once_per_period_in_virtual_time() -> None:
    async def main() -> dict[str, Any]:
        seen = Seen()
        async with InMemoryPubSub() as ps, SignalRuntime(pubsub=ps, agent=seen) as rt:
            made = await rt.schedule("digest", "inbox", Signal({"kind": "digest"}),
                                     every_ms=60_000)
            again = await rt.schedule("digest", "inbox", Signal({"kind": "digest"}),
                                      every_ms=60_000)  # every worker declares it: no change
            await anyio.sleep(5 * 60 + 1)
            listed = [s.schedule_id for s in await rt.schedules()]
            removed = await rt.unschedule("digest")
            before = len(seen.got)
            await anyio.sleep(5 * 60)
            return {"ticks": [round(at - made.anchor, 1) for _, at, _ in seen.got[:before]],
                    "after": len(seen.got) - before, "listed": listed, "removed": removed,
                    "same": (made.anchor, made.every_ms) == (again.anchor, again.every_ms),
                    "gone": await rt.unschedule("digest"), "left": await rt.schedules()}

    out = virtual(main)
    assert out["ticks"] == [60.0, 120.0, 180.0, 240.0, 300.0], out
    assert out["same"] and out["listed"] == ["digest"] and out["removed"], out
    assert out["after"] == 0 and out["gone"] is False and out["left"] == [], out


def test_catch_up_decides_what_missed_ticks_do_in_virtual_time() -> None:
    async def run(catch_up: str) -> list[float]:
        seen = Seen()
        async with InMemoryPubSub() as ps:
            async with SignalRuntime(pubsub=ps, agent=None) as sender:  # no worker runs
                made = await sender.schedule("s", "t", Signal({}), every_ms=10_000,
                                             catch_up=catch_up)  # type: ignore[arg-type]
            await anyio.sleep(35)  # three ticks missed (10, 20, 30)
            async with SignalRuntime(pubsub=ps, agent=seen) as worker:
                await anyio.sleep(24)  # then two more come (40, 50)
                await worker.unschedule("s")
            return [round(at - made.anchor) for _, at, _ in seen.got]

    async def main() -> dict[str, list[float]]:
        return {c: await run(c) for c in ("latest", "all", "none")}

    out = virtual(main)
    assert out["latest"] == [35, 40, 50], out  # one for the missed ones, then on time
    assert out["all"] == [35, 35, 35, 40, 50], out  # each missed one, then on time
    assert out["none"] == [40, 50], out  # the missed ones skipped


def test_cron_ticks_follow_the_zone_across_daylight_saving() -> None:
    paris = ZoneInfo("Europe/Paris")
    before = datetime(2027, 3, 27, 6, 0, tzinfo=paris).timestamp()
    first = next_tick(None, "0 9 * * *", "Europe/Paris", 0.0, before)
    second = next_tick(None, "0 9 * * *", "Europe/Paris", 0.0, first)
    assert datetime.fromtimestamp(first, paris).hour == 9  # Saturday 27th, winter time
    assert datetime.fromtimestamp(second, paris).hour == 9  # Sunday 28th: summer time
    assert second - first == 23 * 3600  # the night of the change is an hour short
    utc = next_tick(None, "0 9 * * *", "UTC", 0.0, before)
    assert utc - first == 3600  # 09:00 UTC is 10:00 in Paris in winter


def test_a_time_past_the_year_9999_is_refused_naming_the_argument() -> None:
    """The largest float as ``expires_at`` (found by fuzzing the HTTP API) overflowed the
    Redis store's milliseconds: a time no store can hold is refused where the signal is made."""
    with pytest.raises(ValueError, match="not_before must be Unix time in seconds up to"):
        Signal({}, not_before=1.7976931348623157e308)
    with pytest.raises(ValueError, match="expires_at must be Unix time in seconds up to"):
        Signal({}, expires_at=1.7976931348623157e308)
    with pytest.raises(ValueError, match="expires_at"):
        Signal({}, expires_at=float("inf"))
    assert Signal({}, expires_at=253_402_300_799).expires_at == 253_402_300_799


def test_bad_schedules_name_the_argument() -> None:
    async def main() -> None:
        async with InMemoryPubSub() as ps, SignalRuntime(pubsub=ps, agent=None) as rt:
            with pytest.raises(ValueError, match="cron='every day'"):
                await rt.schedule("s", "t", Signal({}), cron="every day")
            with pytest.raises(ValueError, match="exactly one of every_ms"):
                await rt.schedule("s", "t", Signal({}))
            with pytest.raises(ValueError, match="exactly one of every_ms"):
                await rt.schedule("s", "t", Signal({}), every_ms=1000, cron="* * * * *")
            with pytest.raises(ValueError, match="every_ms"):
                await rt.schedule("s", "t", Signal({}), every_ms=0)
            with pytest.raises(ValueError, match="tz='Mars/Olympus'"):
                await rt.schedule("s", "t", Signal({}), cron="* * * * *", tz="Mars/Olympus")
            with pytest.raises(ValueError, match="catch_up"):
                await rt.schedule("s", "t", Signal({}), every_ms=1000, catch_up="some")  # type: ignore[arg-type]
            with pytest.raises(ValueError, match="schedule_id"):
                await rt.schedule("", "t", Signal({}), every_ms=1000)
            assert await rt.schedules() == []

    anyio.run(main)


# -- real processes -------------------------------------------------------------------------

WORKER = textwrap.dedent("""
    import json, os, sys, anyio
    from pubsub import SQLitePubSub
    from signals import Run, Signal, SignalRuntime
    db, out_path, seconds, action = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    async def agent(run: Run) -> None:
        async for s in run:
            with open(out_path, "a") as out:
                out.write(json.dumps({"id": s.id, "pid": os.getpid()}) + "\\n")
            await run.ack(s)
    async def main() -> None:
        async with SQLitePubSub(db) as ps, SignalRuntime(pubsub=ps, agent=agent) as rt:
            await rt.schedule("tick", "sched", Signal({}), every_ms=500)
            await anyio.sleep(seconds)
            if action == "stop":
                print(json.dumps({"removed": await rt.unschedule("tick")}), flush=True)
    anyio.run(main)
""")


def _python(*args: str, **kw: Any) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def test_three_workers_fire_each_tick_once(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    db, out = str(tmp_path / "s.db"), str(tmp_path / "ticks.jsonl")
    stayers = [_python(str(script), db, out, "5", "stay") for _ in range(2)]
    stopper = _python(str(script), db, out, "3", "stop")
    said, err = stopper.communicate(timeout=60)
    assert stopper.returncode == 0, err
    time.sleep(0.2)
    at_stop = len(Path(out).read_text().splitlines())
    for p in stayers:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    ids = [json.loads(line)["id"] for line in Path(out).read_text().splitlines()]
    assert json.loads(said.strip().splitlines()[-1]) == {"removed": True}
    assert len(ids) == len(set(ids)), ids  # each tick once across the three
    assert 4 <= at_stop <= 8, ids  # every 500 ms for ~3 s
    assert len(ids) - at_stop <= 1, ids  # unschedule stopped it (a tick in hand may finish)


def test_a_delay_comes_due_while_every_process_is_down(tmp_path: Path) -> None:
    db = tmp_path / "d.db"

    async def send() -> None:
        async with SQLitePubSub(db) as ps, SignalRuntime(pubsub=ps, agent=None) as rt:
            assert (await rt.send("r", Signal({}, id="later"), delay_ms=500)).outcome == (
                "scheduled")

    async def work() -> list[str]:
        seen = Seen()
        async with SQLitePubSub(db) as ps, SignalRuntime(pubsub=ps, agent=seen) as rt:
            with anyio.fail_after(10):
                while not seen.got:  # noqa: ASYNC110
                    await anyio.sleep(0.02)
            receipt = await rt.receipt("r", "later")
            assert receipt is not None and receipt.status == "processed"
        return [sid for sid, _, _ in seen.got]

    anyio.run(send)
    time.sleep(1.0)  # due while nothing runs
    started = time.monotonic()
    assert anyio.run(work) == ["later"]
    assert time.monotonic() - started < 3  # handed out at once, not at a recovery interval
