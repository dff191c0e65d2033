"""A chat page over ``signals.http``: a web front end and a worker running a fake LLM.

    python examples/web/app.py [--redis-url URL] [--port 8000]

Needs the ``http`` extra (``pip install 'signal-leases[http]'``). Open http://127.0.0.1:8000/,
type a message: the page POSTs it as a signal, follows the thread's output stream with an
EventSource (tokens appear as the agent emits them), can stop the answer (abort), shows the
queued messages (each with a cancel button), and resumes exactly where it was after a reload
(the last cursor is kept in localStorage).

One command starts two processes: this one serves the page and the API (a sender-only
``SignalRuntime`` and ``create_app``, mounted at ``/api``), and a worker process runs the
agent. They share Redis, so without ``--redis-url`` a local ``redis-server`` is started (when
one is on ``PATH``). The server listens on loopback only, like ``create_app``'s default.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import structlog

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))  # the checkout, when run without an install
sys.path.insert(0, str(HERE.parent))  # examples/_redis.py

from pubsub import RedisStreamsPubSub  # noqa: E402
from signals import Run, SignalRuntime  # noqa: E402

ANSWER = (
    "Here is what I would say. A signal goes into the thread's inbox and stays there until "
    "a run acknowledges it. Exactly one process owns the thread at a time, because it holds "
    "the lease, and its run streams parts like these words back to you. Press Stop and the "
    "run is aborted from any process; queue more messages and each one waits its turn. "
    "Reload the page and the stream resumes right after the last part you saw."
)


async def fake_llm(run: Run) -> None:
    """The worker's agent: one token at a time, then the whole answer as the result."""
    delay = float(os.environ.get("EXAMPLE_TOKEN_DELAY", "0.08"))
    async for question in run:
        text = question.payload.get("text", "") if isinstance(question.payload, dict) else ""
        words = f"You asked: {text!r}. {ANSWER}".split()
        for word in words:
            await run.emit({"token": word + " "}, signal=question)
            await anyio.sleep(delay)
        await run.ack(question, result={"text": " ".join(words)})


async def worker(redis_url: str, prefix: str, parent: int) -> None:
    """The agent process: runs until SIGTERM/SIGINT or until its parent is gone."""
    async with RedisStreamsPubSub(url=redis_url, key_prefix=prefix) as pubsub, SignalRuntime(
        pubsub=pubsub, agent=fake_llm, shutdown_timeout_ms=2_000
    ), anyio.create_task_group() as tg:

        async def on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    tg.cancel_scope.cancel()

        tg.start_soon(on_signal)
        print("worker ready", flush=True)
        while os.getppid() == parent:  # noqa: ASYNC110 (a parent's exit sets no event)
            await anyio.sleep(0.5)
        tg.cancel_scope.cancel()


async def web(redis_url: str, prefix: str, host: str, port: int) -> None:
    """The page at ``/`` and the HTTP API at ``/api``, served by uvicorn on this loop, until
    SIGINT or SIGTERM."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import FileResponse
    from starlette.routing import Mount, Route

    from signals.http import create_app

    class Server(uvicorn.Server):
        @contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield  # the signals are handled below, in this task group

    async def index(request: Request) -> FileResponse:
        return FileResponse(HERE / "static" / "index.html", headers={"Cache-Control": "no-cache"})

    async with RedisStreamsPubSub(url=redis_url, key_prefix=prefix) as pubsub, SignalRuntime(
        pubsub=pubsub, agent=None
    ) as runtime:
        api = create_app(runtime)
        app = Starlette(routes=[Route("/", index), Mount("/api", app=api)])
        server = Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                       ws="none", timeout_graceful_shutdown=1))

        async def stop_on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    server.force_exit = server.should_exit  # a second signal: at once
                    server.should_exit = True
                    api.close_streams()  # open pages reconnect (and resume) once we are back

        async with anyio.create_task_group() as tg:
            tg.start_soon(stop_on_signal)
            async with anyio.create_task_group() as serving:
                serving.start_soon(server.serve)
                while not server.started:
                    await anyio.sleep(0.05)
                    if server.should_exit:
                        break  # startup failed (the port is taken, say): uvicorn said why
                else:
                    print(f"chat page: http://{host}:{port}/  (Ctrl+C to stop)", flush=True)
            tg.cancel_scope.cancel()


def run_both(redis_url: str, args: argparse.Namespace) -> int:
    """Start the worker process, then serve the page here until interrupted."""
    command = [sys.executable, __file__, "--worker", "--redis-url", redis_url,
               "--prefix", args.prefix]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "worker ready":
            print("error: the worker did not start", file=sys.stderr)
            return 1
        anyio.run(web, redis_url, args.prefix, args.host, args.port, backend="asyncio")
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    # Outside web() (which handles it itself): unwind through the finally blocks, so the
    # worker and the local redis-server stop too.
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    intro, _, details = (__doc__ or "").replace("``", "").partition("\n\n")
    parser = argparse.ArgumentParser(
        description=intro, epilog=details, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--redis-url", default=None,
                        help="Redis to use (default: start a local redis-server)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on")
    parser.add_argument("--prefix", default="example-web", help="Redis key prefix")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    if args.worker:
        anyio.run(worker, args.redis_url, args.prefix, os.getppid(), backend="asyncio")
        return 0
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        print("error: this example needs the http extra: pip install 'signal-leases[http]'",
              file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    from _redis import on_redis

    return on_redis(args.redis_url, lambda url: run_both(url, args))


if __name__ == "__main__":
    raise SystemExit(main())
