"""One worker process of ``python -m signals.soak``: ``python -m signals.soak.worker CONFIG``.

``CONFIG`` is a :class:`~signals.soak.options.WorkerConfig` as JSON. The worker builds its
pub/sub (``FactoryContext(role="worker")``), runs a ``SignalRuntime`` with the soak's agent
(see :mod:`signals.soak.record`), prints one JSON line ``{"ready": ..., "pid": ...,
"runtime_id": ...}`` on stdout, and serves until SIGTERM or SIGINT: then it leaves the runtime
(runs finish, or are cancelled after ``shutdown_timeout_ms``) and exits 0. The soak kills it
with SIGKILL at random.

A backend that cannot be reached at start (Redis restarting, a black hole) is retried for a
minute; an error after the runtime started ends the process with a traceback on stderr, which
the soak reports as a worker crash.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
from contextlib import AsyncExitStack
from pathlib import Path

import anyio

from _signal_leases.aio import loop_time
from _signal_leases.errors import BackendUnavailableError
from signals._runtime import SignalRuntime
from signals.soak.options import (
    FactoryContext,
    WorkerConfig,
    open_backend,
    quiet_library_logs,
    runtime_settings,
)
from signals.soak.record import FenceStore, Recorder, make_agent

__all__ = ["main"]

START_RETRY_S = 60.0


async def serve(config: WorkerConfig) -> None:
    pid = os.getpid()
    records = Path(config.records)
    recorder = Recorder(records / f"w{config.slot:02d}-{pid}.jsonl")
    agent = make_agent(recorder, FenceStore(records / "fence"), work_ms=config.work_ms,
                       rng=random.Random(config.seed * 1_000_003 + pid),
                       block_ms=config.block_ms)
    ctx = FactoryContext("worker", config.key_prefix, config.url, config.slot, config.ttl_ms)
    deadline = loop_time() + START_RETRY_S
    started = False
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as stop:
        while True:
            try:
                backend = await open_backend(config.backend, ctx)
                async with AsyncExitStack() as stack:
                    await backend.enter(stack)
                    runtime = await stack.enter_async_context(SignalRuntime(
                        agent=agent, **backend.runtime_kwargs(), **runtime_settings(config.ttl_ms)
                    ))
                    started = True
                    print(json.dumps({"ready": config.slot, "pid": pid,
                                      "runtime_id": runtime.runtime_id}), flush=True)
                    async for _ in stop:
                        break
                break
            except BackendUnavailableError:
                if started or loop_time() > deadline:
                    raise
                await anyio.sleep(0.5)
    recorder.close()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m signals.soak.worker CONFIG_JSON", file=sys.stderr)
        return 2
    quiet_library_logs()
    anyio.run(serve, WorkerConfig(**json.loads(args[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
