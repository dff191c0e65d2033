"""``python -m signals.soak``: a fault soak of the signal runtime, with a verdict.

It runs ``--workers`` worker processes (each a ``SignalRuntime`` with an agent) on
``--threads`` threads while a sender-only runtime sends signals with known ids, and, for
``--seconds``: SIGKILLs a random owner every ``--kill-every`` seconds (a replacement worker
starts each time), restarts Redis every ``--restart-redis-every`` seconds (only a Redis the
soak started itself, with AOF and ``appendfsync always``), and black-holes one worker's
connections for ``--blackhole-seconds`` every ``--blackhole-every`` seconds (workers reach
Redis through the soak's loopback proxy). Then it waits until every accepted signal's receipt
is final and checks what the agents recorded (``signals.soak.record``): lost signals,
duplicates, overlapping runs on a thread, fencing-token order, takeover latency
(``signals.soak.verify`` says exactly how each figure is made).

Exit status: 0 when nothing was lost, no two runs of a thread overlapped and no token went
backwards; 1 otherwise (or when nothing was accepted at all); 2 for a usage or setup error;
130 on Ctrl-C. The report goes to stdout, with a one-line summary last; with ``--json`` the
result is one JSON document on stdout and the report (summary last) goes to stderr.

Backends: ``memory`` (one process, no faults: the send/verify path), ``redis`` (the soak's
own redis-server, or ``--redis-url``: then no restarts), ``cluster`` (``--redis-url`` of a
seed node; kills only), ``sqlite`` (one file in the soak's work directory; kills only),
``postgres`` (its own PostgreSQL, restarted too, or ``--postgres-dsn``: then kills only), or
``module:factory`` for your own: a callable that takes a :class:`FactoryContext` and returns
an unentered pub/sub or a :class:`SoakBackend` (pub/sub, leases, inbox), or an awaitable of
one, called in every worker process and in the sender. See docs/guarantees.md, "The fault
soak".
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import anyio

from signals.soak.options import (
    BUILTIN_BACKENDS,
    FactoryContext,
    SoakBackend,
    SoakOptions,
    load_factory,
    quiet_library_logs,
)

__all__ = ["FactoryContext", "Interrupted", "SoakBackend", "build_parser", "main", "run_soak"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m signals.soak",
        description="Fault soak of the signal runtime: kills, server restarts, black holes; "
                    "then a verdict on lost signals, overlapping runs and fencing tokens.",
        epilog="A custom backend: --backend mypkg.module:factory, where factory(ctx) takes a "
               "signals.soak.FactoryContext (role, key_prefix, url, worker, ttl_ms) and "
               "returns an unentered pub/sub, or a signals.soak.SoakBackend(pubsub, leases, "
               "inbox) when the store is passed apart. Exit status 0: passed; 1: failed; "
               "2: usage or setup error.",
    )
    add = parser.add_argument
    add("--backend", default="redis",
        help="memory, redis, cluster, sqlite, postgres or module:factory (default: redis)")
    add("--postgres-dsn", default=None,
        help="an existing PostgreSQL for --backend postgres (a schema per run; then no "
             "restarts); without it the soak starts its own")
    add("--redis-url", default=None,
        help="an existing Redis (redis) or a cluster seed node (cluster); without it the "
             "redis backend starts its own redis-server with AOF")
    add("--seconds", type=float, default=60.0, help="length of the fault phase (default 60)")
    add("--workers", type=int, default=4, help="worker processes (default 4)")
    add("--threads", type=int, default=16,
        help="long-lived threads signals go to, besides short conversations (default 16)")
    add("--kill-every", type=float, default=3.0,
        help="SIGKILL a random owner every N seconds; 0: never (default 3)")
    add("--restart-redis-every", "--restart-server-every", dest="restart_redis_every",
        type=float, default=30.0,
        help="restart the soak's own server (Redis, or PostgreSQL: immediate and fast stops "
             "in turn) every N seconds; 0: never (default 30)")
    add("--blackhole-every", type=float, default=20.0,
        help="black-hole one worker's connections every N seconds; 0: never (default 20)")
    add("--blackhole-seconds", type=float, default=3.0,
        help="how long a black hole lasts (default 3)")
    add("--ttl-ms", type=int, default=2000, help="lease TTL of the workers (default 2000)")
    add("--rate", type=float, default=40.0, help="new signals per second (default 40)")
    add("--work-ms", type=int, default=100,
        help="the agent works a random time up to this per signal (default 100)")
    add("--drain-seconds", type=float, default=None,
        help="how long to wait for receipts after the fault phase (default max(30, 15 TTLs))")
    add("--seed", type=int, default=None, help="random seed (default: random, printed)")
    add("--json", action="store_true", help="print the result as JSON on stdout")
    add("--keep", action="store_true",
        help="keep the records directory (always kept when the soak fails)")
    add("--no-aof", action="store_true",
        help="run the soak's own Redis without persistence (to see what the soak catches)")
    add("--blocking-agent-ms", type=int, default=0, metavar="MS",
        help="make the agent block its event loop MS ms on 2%% of signals (a misbehaving "
             "agent, to see what the soak catches; default 0: never)")
    return parser


def parse_options(argv: list[str] | None = None) -> SoakOptions:
    parser = build_parser()
    a = parser.parse_args(argv)
    for name in ("workers", "threads", "ttl_ms"):
        if getattr(a, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("seconds", "rate"):
        if not getattr(a, name) > 0:
            parser.error(f"--{name} must be positive")
    for name in ("kill_every", "restart_redis_every", "blackhole_every", "blackhole_seconds"):
        if getattr(a, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be 0 or more")
    if a.work_ms < 0 or a.blocking_agent_ms < 0 or (
        a.drain_seconds is not None and a.drain_seconds < 0
    ):
        parser.error("--work-ms, --blocking-agent-ms and --drain-seconds must be 0 or more")
    if a.backend == "cluster" and not a.redis_url:
        parser.error("--backend cluster needs --redis-url (a seed node of the cluster)")
    if a.backend not in BUILTIN_BACKENDS:
        try:
            load_factory(a.backend)
        except ValueError as exc:
            parser.error(str(exc))
    return SoakOptions(
        backend=a.backend, redis_url=a.redis_url, seconds=a.seconds, workers=a.workers,
        threads=a.threads, kill_every=a.kill_every, restart_redis_every=a.restart_redis_every,
        blackhole_every=a.blackhole_every, blackhole_seconds=a.blackhole_seconds,
        ttl_ms=a.ttl_ms, rate=a.rate, work_ms=a.work_ms,
        drain_seconds=(a.drain_seconds if a.drain_seconds is not None
                       else max(30.0, 15 * a.ttl_ms / 1000)),
        seed=a.seed if a.seed is not None else random.randrange(1_000_000),
        json=a.json, keep=a.keep, no_aof=a.no_aof, block_ms=a.blocking_agent_ms,
        postgres_dsn=a.postgres_dsn,
    )


class Interrupted(Exception):
    """The soak was stopped by SIGINT or SIGTERM (its workers and Redis were stopped)."""


async def run_soak(options: SoakOptions, workdir: Path) -> dict[str, Any]:
    """Run one soak in ``workdir`` and return its result (see :func:`main`). SIGINT or
    SIGTERM cancels it: every worker process and the soak's Redis are stopped, then
    :class:`Interrupted` is raised."""
    from signals.soak.run import SoakRun
    from signals.soak.verify import verify

    stopped_by: list[int] = []
    async with anyio.create_task_group() as tg:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as received:

            async def watch() -> None:
                async for signum in received:
                    stopped_by.append(signum)
                    tg.cancel_scope.cancel()
                    return

            tg.start_soon(watch, name="soak signal watcher")
            facts = await SoakRun(options, workdir).run()
            tg.cancel_scope.cancel()
    if stopped_by:
        raise Interrupted(signal.Signals(stopped_by[0]).name)
    return verify(facts)


def main(argv: list[str] | None = None) -> int:
    from signals.soak.verify import format_report, summary_line

    options = parse_options(argv)
    quiet_library_logs()
    workdir = Path(tempfile.mkdtemp(prefix="signals-soak-"))
    try:
        result = anyio.run(run_soak, options, workdir)
    except (KeyboardInterrupt, Interrupted) as exc:
        print(f"soak interrupted ({exc or 'SIGINT'}); records in {workdir}", file=sys.stderr)
        return 130
    except Exception as exc:
        traceback.print_exc()
        print(f"soak could not run: {type(exc).__name__}: {exc}; records in {workdir}",
              file=sys.stderr)
        return 2
    if options.keep or not result["ok"]:
        (workdir / "result.json").write_text(json.dumps(result, indent=2))
    else:
        shutil.rmtree(workdir, ignore_errors=True)
        result["settings"]["records"] = f"{workdir} (deleted; --keep keeps it)"
    report = format_report(result) + "\n" + summary_line(result)
    if options.json:
        print(json.dumps(result, indent=2), flush=True)
        print(report, file=sys.stderr, flush=True)
    else:
        print(report, flush=True)
    return 0 if result["ok"] else 1

