"""The soak's worker processes: start them, kill them, replace them, stop them.

Each worker slot is served by one task (:meth:`Fleet.keep`) for the whole soak: it starts a
worker process (``python -m signals.soak.worker``), waits for its ready line, waits for it
to exit, notes when it was reaped, and starts a replacement, until the fleet stops. A kill
(:meth:`Fleet.kill`) only sends SIGKILL; the slot's task reaps the process and replaces it.
An exit the soak did not cause is a crash: it is counted and reported, and the slot starts
a replacement a second later.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from signals.soak.options import WorkerConfig

if TYPE_CHECKING:
    from collections.abc import Callable

    from anyio.abc import Process

    from signals.soak.proxy import Route

__all__ = ["Exit", "Fleet", "KillEvent", "Slot"]

READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0


@dataclass
class KillEvent:
    """One SIGKILL: the victim, when it was sent and when the process was reaped (monotonic)."""

    slot: int
    pid: int
    runtime_id: str | None
    at: float
    reaped: float | None = None


@dataclass(frozen=True)
class Exit:
    """A worker process that ended: how, and when it was reaped (monotonic)."""

    slot: int
    pid: int
    code: int | None
    at: float
    cause: str  # "killed" (by the soak), "stopped" (SIGTERM at the end) or "crashed"


@dataclass
class Slot:
    index: int
    url: str | None
    route: Route | None = None
    proc: Process | None = None
    pid: int | None = None
    runtime_id: str | None = None
    ready: bool = False
    kill: KillEvent | None = None
    starts: int = 0


@dataclass
class Fleet:
    """The worker processes of one soak run."""

    backend: str
    key_prefix: str
    ttl_ms: int
    work_ms: int
    seed: int
    workdir: Path
    say: Callable[[str], None]
    block_ms: int = 0
    slots: list[Slot] = field(default_factory=list)
    kills: list[KillEvent] = field(default_factory=list)
    exits: list[Exit] = field(default_factory=list)
    startup_s: list[float] = field(default_factory=list)  # spawn to ready, per worker
    _stopping: bool = False
    _change: anyio.Event | None = None

    @property
    def ready(self) -> list[Slot]:
        return [s for s in self.slots if s.ready and s.kill is None]

    def _command(self, slot: Slot) -> list[str]:
        config = WorkerConfig(
            backend=self.backend, url=slot.url, key_prefix=self.key_prefix, slot=slot.index,
            ttl_ms=self.ttl_ms, work_ms=self.work_ms, records=str(self.workdir / "records"),
            seed=self.seed, block_ms=self.block_ms,
        )
        return [sys.executable, "-m", "signals.soak.worker", json.dumps(asdict(config))]

    def _env(self) -> dict[str, str]:
        """The parent's environment, with this checkout first on ``PYTHONPATH`` (so workers
        run the code the soak runs; a factory module importable here is importable there)."""
        root = str(Path(__file__).resolve().parent.parent)
        inherited = os.environ.get("PYTHONPATH", "").split(os.pathsep)
        paths = [root, os.getcwd(), *filter(None, inherited)]
        return {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}

    def is_stopping(self) -> bool:
        return self._stopping

    def _changed(self) -> None:
        """Wake whoever waits for a slot to change (:meth:`_wait_change`)."""
        change, self._change = self._change, None
        if change is not None:
            change.set()

    async def _wait_change(self) -> None:
        if self._change is None:
            self._change = anyio.Event()
        await self._change.wait()

    async def keep(self, slot: Slot) -> None:
        """Keep one worker running in ``slot`` until the fleet stops (see the module)."""
        logs = self.workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log_path = logs / f"w{slot.index:02d}.log"
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            while not self.is_stopping():
                await self._one_worker(slot, log, log_path)
        finally:
            os.close(log)

    async def _one_worker(self, slot: Slot, log: int, log_path: Path) -> None:
        """Start a worker in ``slot``, wait for it to end, and note how it ended."""
        spawned = time.monotonic()
        proc = await anyio.open_process(
            self._command(slot), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=log, env=self._env(),
        )
        slot.proc, slot.pid, slot.runtime_id, slot.ready = proc, proc.pid, None, False
        slot.starts += 1
        try:
            if self.is_stopping():
                proc.terminate()
            ready = await _read_ready(proc)
            if ready is not None:
                slot.runtime_id = str(ready["runtime_id"])
                slot.ready = True
                self.startup_s.append(time.monotonic() - spawned)
                self._changed()
            await proc.wait()
        finally:
            with anyio.CancelScope(shield=True):
                if proc.returncode is None:  # cancelled: leave nothing behind
                    proc.kill()
                    await proc.wait()
                await proc.aclose()
            slot.ready, slot.proc = False, None
            self._changed()
        reaped = time.monotonic()
        kill, slot.kill = slot.kill, None
        if kill is not None:
            kill.reaped = reaped
            cause = "killed"
        elif self.is_stopping():
            cause = "stopped"
        else:
            cause = "crashed"
        self.exits.append(Exit(slot.index, proc.pid, proc.returncode, reaped, cause))
        if cause == "crashed":
            self.say(f"soak: worker {slot.index} (pid {proc.pid}) exited by itself with code "
                     f"{proc.returncode}: see {log_path}")
            await anyio.sleep(1)

    async def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        with anyio.fail_after(timeout):
            while len(self.ready) < len(self.slots):
                await self._wait_change()

    def kill(self, slot: Slot) -> KillEvent | None:
        """SIGKILL the worker in ``slot`` (its task reaps it and starts a replacement)."""
        proc = slot.proc
        if proc is None or not slot.ready or slot.kill is not None or proc.returncode is not None:
            return None
        event = KillEvent(slot.index, proc.pid, slot.runtime_id, time.monotonic())
        slot.kill = event
        self.kills.append(event)
        proc.send_signal(signal.SIGKILL)
        return event

    async def stop(self) -> int:
        """SIGTERM every worker (they leave their runtimes gracefully); SIGKILL those still
        running after ``STOP_TIMEOUT_S``. Returns how many had to be killed."""
        self._stopping = True
        for slot in self.slots:
            if slot.proc is not None and slot.proc.returncode is None:
                slot.proc.terminate()
        hung = 0
        with anyio.move_on_after(STOP_TIMEOUT_S):
            while any(s.proc is not None for s in self.slots):
                await self._wait_change()
        for slot in self.slots:
            if slot.proc is not None and slot.proc.returncode is None:
                hung += 1
                slot.proc.kill()
        with anyio.move_on_after(STOP_TIMEOUT_S):
            while any(s.proc is not None for s in self.slots):
                await self._wait_change()
        return hung


async def _read_ready(proc: Process) -> dict[str, Any] | None:
    """The worker's ready line, or ``None`` if it exited first."""
    assert proc.stdout is not None
    buffer = b""
    try:
        with anyio.fail_after(READY_TIMEOUT_S):
            while b"\n" not in buffer:
                buffer += await proc.stdout.receive()
    except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
        return None
    except TimeoutError:
        proc.kill()
        return None
    ready: dict[str, Any] = json.loads(buffer.split(b"\n", 1)[0])
    return ready
