"""Time as an input: a personal assistant's thread gets a daily digest, debounced typing and a
reminder the user asked for.

* The digest is a schedule: declared by every worker at start (the same id again changes
  nothing), fired once per tick whatever the number of workers. In production it is
  ``cron="0 8 * * *", tz="Europe/Paris"``; this demo also declares one ``every_ms=1500`` so
  that you see ticks.
* Keystrokes go to a ``typing`` lane that coalesces and waits for 300 ms of quiet
  (``debounce_ms``): the agent gets one signal with every keystroke in it.
* "Remind me in 2 seconds" is a delayed signal (``delay_ms``), stored at once with receipt
  ``scheduled``; it survives a restart of every process.
* A CI status that is worthless after one second (``expires_in_ms``) expires unseen while the
  thread is paused.

    python examples/time_agent.py                # in memory
    python examples/time_agent.py --sqlite FILE  # durable, in a SQLite file
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import anyio

from pubsub import InMemoryPubSub, SQLitePubSub
from signals import Run, Signal, SignalRuntime

THREAD = "assistant"


def fold_typing(signals: list[Signal]) -> dict[str, Any]:
    return {"text": "".join(s.payload["key"] for s in signals)}


async def main(args: argparse.Namespace) -> None:
    t0 = time.monotonic()

    def say(text: str) -> None:
        print(f"{time.monotonic() - t0:5.1f} s  {text}")

    async def agent(run: Run) -> None:
        async for signal in run:
            say(f"agent got {signal.type:9} {signal.payload}")
            await run.ack(signal)

    pubsub: Any = SQLitePubSub(args.sqlite) if args.sqlite else InMemoryPubSub()
    async with pubsub, SignalRuntime(pubsub=pubsub, agent=agent,
                                     reducers={"typing": fold_typing}) as runtime:
        daily = await runtime.schedule("daily-digest", THREAD, Signal({"digest": "daily"},
                                       type="digest"), cron="0 8 * * *", tz="Europe/Paris")
        await runtime.schedule("demo-digest", THREAD, Signal({"digest": "demo"}, type="digest"),
                               every_ms=1500)
        say(f"schedules: {[s.schedule_id for s in await runtime.schedules()]}; the daily one "
            f"next fires at {daily.next_at:.0f} (Unix time, 08:00 in Paris)")

        reminder = await runtime.send(THREAD, Signal({"remind": "call Ada"}, type="reminder"),
                                      delay_ms=2000)
        say(f"reminder in 2 s: {reminder.outcome}")

        for key in "hello":
            await runtime.send(THREAD, Signal({"key": key}, type="typing", lane="typing",
                                              merge="coalesce", debounce_ms=300))
            await anyio.sleep(0.08)
        say("typed 'hello', one key every 80 ms")

        await runtime.pause("ci")
        ci = Signal({"build": 7, "status": "running"}, type="ci", id="ci-7")
        await runtime.send("ci", ci, expires_in_ms=1000)
        await anyio.sleep(3.6)
        await runtime.resume("ci")
        await runtime.wait_idle()
        receipt = await runtime.receipt("ci", "ci-7")
        say(f"the CI status sent to a paused thread: {receipt.status if receipt else None}")
        say(f"unschedule demo-digest: {await runtime.unschedule('demo-digest')}")
        await runtime.unschedule("daily-digest")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sqlite", default=None, metavar="FILE")
    anyio.run(main, parser.parse_args())


if __name__ == "__main__":
    cli()
