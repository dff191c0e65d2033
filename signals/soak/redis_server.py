"""The soak's own ``redis-server``: started with AOF, killed and restarted on the same port.

With ``--appendonly yes --appendfsync always`` Redis fsyncs every write before it answers,
so a SIGKILL loses nothing that was acknowledged: the lease fencing counters, the inboxes,
the receipts all come back when the server restarts from its AOF. (``persistence=False``
runs it without, to watch the soak catch what that breaks.)
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from pathlib import Path

    from anyio.abc import Process

__all__ = ["OwnRedis", "free_port", "redis_server_binary"]

START_TIMEOUT_S = 60.0


def redis_server_binary() -> str | None:
    """``redis-server`` on ``PATH`` (or ``None``)."""
    return shutil.which("redis-server")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def ping(port: int) -> bool:
    """``PING`` answered with ``+PONG`` (a server still loading its AOF answers ``-LOADING``)."""
    try:
        with anyio.fail_after(1):
            async with await anyio.connect_tcp("127.0.0.1", port) as stream:
                await stream.send(b"PING\r\n")
                return (await stream.receive(64)).startswith(b"+PONG")
    except (OSError, TimeoutError, anyio.EndOfStream, anyio.BrokenResourceError):
        return False


class OwnRedis:
    """One ``redis-server`` on 127.0.0.1, its data and log in ``directory``."""

    def __init__(self, binary: str, directory: Path, *, persistence: bool = True) -> None:
        self.binary = binary
        self.directory = directory
        self.persistence = persistence
        self.port = free_port()
        self.restarts = 0
        self._proc: Process | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._proc is not None

    def _args(self) -> list[str]:
        durable = ["--appendonly", "yes", "--appendfsync", "always"]
        return [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            *(durable if self.persistence else ["--appendonly", "no"]),
            "--dir", str(self.directory),
            "--daemonize", "no",
            "--protected-mode", "no",
            "--loglevel", "warning",
            "--logfile", str(self.directory / "redis.log"),
        ]

    async def start(self) -> None:
        """Start the server and wait until it answers ``PING`` (its AOF loaded)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        proc = self._proc = await anyio.open_process(
            self._args(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, cwd=self.directory,
        )
        with anyio.move_on_after(START_TIMEOUT_S):
            while proc.returncode is None:
                if await ping(self.port):
                    return
                await anyio.sleep(0.02)
        await self.stop()
        log = self.directory / "redis.log"
        tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
        raise RuntimeError(f"redis-server did not start on port {self.port}:\n{tail}")

    async def kill(self) -> None:
        """SIGKILL the server and reap it."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.returncode is None:
                proc.send_signal(signal.SIGKILL)
            with anyio.CancelScope(shield=True):
                await proc.wait()

    async def restart(self, down_s: float = 0.5) -> None:
        """SIGKILL, stay down ``down_s`` seconds, start again on the same port."""
        await self.kill()
        await anyio.sleep(down_s)
        await self.start()
        self.restarts += 1

    async def ensure_running(self) -> None:
        if self._proc is None or self._proc.returncode is not None:
            await self.start()

    async def stop(self) -> None:
        """SIGTERM (SIGKILL after 5 s) and reap."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with anyio.CancelScope(shield=True):
            if proc.returncode is None:
                proc.terminate()
                with anyio.move_on_after(5):
                    await proc.wait()
                if proc.returncode is None:
                    proc.kill()
            await proc.wait()
