"""The soak's evidence: what every agent saw, written where no fault of the soak can reach.

Each worker process appends JSON lines to a file of its own (``records/w<slot>-<pid>.jsonl``),
one ``os.write`` per record on an ``O_APPEND`` descriptor: once the call returned, the line is
in the kernel's page cache and survives a SIGKILL of the writer; a Redis restart, a black
hole or a failover of the backend under test cannot touch it. Times are
``time.monotonic()``: CLOCK_MONOTONIC, one clock for every process of the machine (the soak
runs all its workers on the machine it runs on).

Records (``k`` is the kind):

* ``start``: written at the agent's entry, *before* it does anything: ``th`` (thread),
  ``run``, ``rt`` (runtime id), ``tok`` (``run.token``), ``pid``, ``t``.
* ``got``: a signal handed to the agent, before its work: ``th``, ``id``, ``run``, ``t``.
* ``sig``: one signal processed, written after the work and *before* the acknowledgement:
  ``th``, ``id``, ``run``, ``rt``, ``tok``, ``pid``, ``s`` and ``e`` (start and end of the
  work), ``att`` (``signal.attempt``), ``fence`` (the outcome of its fenced writes).
* ``end``: written when the agent exits, however it exits (``how``: finished, failed or
  cancelled), with ``t``. A run killed by SIGKILL has no ``end``: the verifier then takes
  the moment the soak reaped the process, which is later than anything the run did.

So a run's recorded interval ``[start.t, end.t]`` always contains everything its agent did,
which is what makes the overlap check sound (it can only err towards reporting an overlap).

Fencing: :class:`FenceStore` stands for the storage an agent writes to. A fenced write of a
thread refuses a token lower than the highest accepted so far (the way ``run.token`` is meant
to be used); accepted writes are appended, in acceptance order, to the thread's log
(``fence/<thread>.log``: ``seq token run signal pid``) under an exclusive ``flock``.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import time
from typing import TYPE_CHECKING, Any

import anyio

if TYPE_CHECKING:
    from pathlib import Path

    from signals._run import Run
    from signals._runtime import Agent

__all__ = ["FenceStore", "Recorder", "make_agent", "read_fence_logs", "read_records"]

_LOCK_POLL_S = 0.001


class Recorder:
    """Append-only JSON lines in one file, one ``os.write`` per record (see the module)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, **fields: Any) -> None:
        if self._fd is None:
            raise ValueError(f"recorder {self.path} is closed")
        line = json.dumps(fields, separators=(",", ":")) + "\n"
        os.write(self._fd, line.encode())

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class FenceStore:
    """Fenced writes, per thread, in files shared by every process of the soak."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory

    async def write(self, thread: str, token: int, run_id: str, signal_id: str) -> bool:
        """Accept the write (``True``) unless a higher token was accepted for ``thread``."""
        fd = os.open(self.directory / f"{thread}.log", os.O_RDWR | os.O_CREAT | os.O_APPEND,
                     0o644)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    await anyio.sleep(_LOCK_POLL_S)  # never block the event loop on a lock
            # From here to the close: no await, so a cancellation cannot split the write.
            seq, highest = _last_entry(fd)
            if highest is not None and token < highest:
                return False
            os.write(fd, f"{seq + 1} {token} {run_id} {signal_id} {os.getpid()}\n".encode())
            return True
        finally:
            os.close(fd)  # releases the lock


def _last_entry(fd: int) -> tuple[int, int | None]:
    """``(seq, token)`` of the last line of a fence log (``(0, None)`` when empty)."""
    size = os.fstat(fd).st_size
    if size == 0:
        return 0, None
    chunk = os.pread(fd, min(size, 4096), max(0, size - 4096))
    last = chunk.rstrip(b"\n").rsplit(b"\n", 1)[-1].split()
    return int(last[0]), int(last[1])


#: Share of signals on which an agent made with ``block_ms`` blocks its event loop.
BLOCK_SHARE = 0.02


def make_agent(
    recorder: Recorder, fence: FenceStore, *, work_ms: int, rng: random.Random,
    block_ms: int = 0,
) -> Agent:
    """The soak's agent: for each signal, work a random time up to ``work_ms`` with two
    fenced writes, record it, then acknowledge it. It never blocks the event loop, unless
    ``block_ms``: then, on ``BLOCK_SHARE`` of the signals, it blocks it that long between
    its two fenced writes (a misbehaving agent, to watch the soak report what that breaks)."""
    pid = os.getpid()
    now = time.monotonic

    async def agent(run: Run) -> None:
        thread, run_id, token = run.thread_key, run.run_id, run.token
        runtime = run_id.partition("/")[0]
        recorder.write(k="start", th=thread, run=run_id, rt=runtime, tok=token, pid=pid, t=now())
        how = "cancelled"
        try:
            async for signal in run:
                start = now()
                recorder.write(k="got", th=thread, id=signal.id, run=run_id, t=start)
                fenced: list[bool] = []
                for share in (1.0, 0.25):
                    if share < 1 and block_ms and rng.random() < BLOCK_SHARE:
                        time.sleep(block_ms / 1000)  # noqa: ASYNC251  (deliberately blocking)
                    await anyio.sleep(rng.random() * work_ms * share / 1000)
                    if token is not None:
                        fenced.append(await fence.write(thread, token, run_id, signal.id))
                recorder.write(k="sig", th=thread, id=signal.id, run=run_id, rt=runtime,
                               tok=token, pid=pid, s=start, e=now(), att=signal.attempt,
                               fence=fenced)
                await run.ack(signal, result={"pid": pid})
            how = "finished"
        except Exception:
            how = "failed"
            raise
        finally:
            recorder.write(k="end", th=thread, run=run_id, rt=runtime, pid=pid, t=now(),
                           how=how)

    return agent


def read_records(directory: Path) -> list[dict[str, Any]]:
    """Every record of every worker file in ``directory`` (a torn last line is skipped)."""
    out: list[dict[str, Any]] = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_bytes().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def read_fence_logs(directory: Path) -> dict[str, list[tuple[int, int]]]:
    """``{thread: [(seq, token), ...]}`` in acceptance order."""
    logs: dict[str, list[tuple[int, int]]] = {}
    if not directory.is_dir():
        return logs
    for path in sorted(directory.glob("*.log")):
        entries = []
        for line in path.read_bytes().splitlines():
            parts = line.split()
            if len(parts) >= 2:
                entries.append((int(parts[0]), int(parts[1])))
        logs[path.stem] = entries
    return logs
