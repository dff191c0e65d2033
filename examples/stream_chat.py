"""A chat client that streams the answer: a sender-only runtime and a worker.

    python examples/stream_chat.py                    # in memory: worker and client in one process
    python examples/stream_chat.py --redis-url URL    # the worker runs in a process of its own

The client (``SignalRuntime(agent=None)``) sends a question with ``if_idle="enqueue"`` (it
never runs the agent), prints the parts of the thread's output stream as they arrive, and
prints the signal's receipt with the result. The worker runs a fake LLM agent: it emits one
token at a time (``run.emit``) and acknowledges the question with the whole answer as result.
On Redis the client can be a web handler or a serverless function, and the worker a
long-running process elsewhere: nothing else changes.
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import uuid
from pathlib import Path

import anyio
import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pubsub import InMemoryPubSub, PubSub, RedisStreamsPubSub
from signals import Run, Signal, SignalRuntime

THREAD = "chat-1"
ANSWER = "Signals go in, parts come out, and the receipt says it was processed."


async def fake_llm(run: Run) -> None:
    """The worker's agent: stream the answer token by token, then acknowledge."""
    async for question in run:
        words = []
        for word in ANSWER.split():
            words.append(word)
            await run.emit({"token": word + " "}, signal=question)
            await anyio.sleep(0.03)
        await run.ack(question, result={"answer": " ".join(words)})


async def client(pubsub: PubSub) -> None:
    async with SignalRuntime(pubsub=pubsub, agent=None) as runtime:
        question = Signal({"text": "What does this library do?"}, id=f"q-{uuid.uuid4().hex[:8]}")
        start = await runtime.stream_end(THREAD)
        delivery = await runtime.send(THREAD, question, if_idle="enqueue")
        print(f"sent {question.id}: {delivery.outcome} (a worker will run it)")
        print("answer: ", end="", flush=True)
        async for part in runtime.stream(THREAD, after=start):
            if part.kind == "part" and part.signal_id == question.id:
                print(part.data["token"], end="", flush=True)
            if part.kind == "signal.acked" and part.signal_id == question.id:
                break
        print()
        receipt = await runtime.wait_for(THREAD, question.id, timeout=10)
        print(f"receipt: {receipt.status}, run {receipt.run_id}, result {receipt.result}")


async def in_memory() -> None:
    async with InMemoryPubSub() as pubsub, SignalRuntime(pubsub=pubsub, agent=fake_llm):
        await client(pubsub)


async def worker(url: str, prefix: str) -> None:
    pubsub = RedisStreamsPubSub(url=url, key_prefix=prefix)
    async with pubsub, SignalRuntime(pubsub=pubsub, agent=fake_llm, idle_wait_ms=200):
        print("worker ready", flush=True)
        await anyio.sleep_forever()


async def on_redis(url: str, prefix: str) -> None:
    pubsub = RedisStreamsPubSub(url=url, key_prefix=prefix)
    async with pubsub:
        await client(pubsub)


def with_worker_process(url: str) -> None:
    """Start the worker in a process of its own, then run the client here."""
    prefix = f"example-chat-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(
        [sys.executable, __file__, "--worker", "--redis-url", url, "--prefix", prefix],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        proc.stdout.readline()  # "worker ready"
        anyio.run(on_redis, url, prefix, backend="asyncio")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    if args.worker:
        anyio.run(worker, args.redis_url, args.prefix, backend="asyncio")
    elif args.redis_url:
        with_worker_process(args.redis_url)
    else:
        anyio.run(in_memory)


if __name__ == "__main__":
    main()
