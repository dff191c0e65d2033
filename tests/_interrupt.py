"""The interrupt scenario that every backend's tests run: a run waits for more signals when
another runtime (or a ``RedisSignalSender``) interrupts it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from signals import Run

__all__ = ["RunRecorder", "interrupt_a_waiting_run"]


class RunRecorder:
    """An agent that records each run (whether it was interrupted, the payloads it got) and
    acknowledges each signal; ``waiting`` is set once a run has acknowledged one."""

    def __init__(self) -> None:
        self.runs: list[tuple[bool, list[Any]]] = []
        self.waiting = anyio.Event()

    async def __call__(self, run: Run) -> None:
        got: list[Any] = []
        self.runs.append((run.interrupted, got))
        async for signal in run:
            got.append(signal.payload)
            await run.ack(signal)
            self.waiting.set()


async def interrupt_a_waiting_run(recorder: RunRecorder, send: Callable[..., Awaitable[Any]],
                                  *, timeout: float) -> None:
    """``first`` reaches a run, which then waits for more; ``stop`` interrupts it. The run is
    cancelled without seeing ``stop``, which a new run gets, with ``Run.interrupted`` set."""
    await send("t", "first")
    with anyio.fail_after(timeout):
        await recorder.waiting.wait()
    assert (await send("t", "stop", if_active="interrupt")).outcome == "deliver"
    with anyio.fail_after(timeout):
        while len(recorder.runs) < 2 or not recorder.runs[1][1]:  # noqa: ASYNC110
            await anyio.sleep(0.01)
    assert recorder.runs == [(False, ["first"]), (True, ["stop"])]
