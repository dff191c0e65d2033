"""The soak's own PostgreSQL (``--backend postgres`` without ``--postgres-dsn``).

Debian's ``postgresql`` binaries: ``initdb`` into the soak's work directory, ``pg_ctl`` on a
free loopback port with trust authentication and ``fsync=on``. PostgreSQL refuses to run as
root; as root the server runs as the ``postgres`` user (``runuser``). A restart alternates
``immediate`` (no shutdown checkpoint: as after a crash, the WAL is replayed) and ``fast``
(clients disconnected, a clean shutdown) and starts it again on the same port.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import anyio
import anyio.to_thread

from signals.soak.redis_server import free_port

__all__ = ["OwnPostgres", "postgres_bin_dir"]


def postgres_bin_dir() -> str | None:
    """The newest ``/usr/lib/postgresql/<version>/bin`` (``$PG_BIN`` wins), or ``pg_ctl``'s
    directory on ``PATH``; ``None`` without PostgreSQL."""
    if os.environ.get("PG_BIN"):
        return os.environ["PG_BIN"]
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
                   key=lambda p: [int(x) for x in Path(p).parts[-3].split(".") if x.isdigit()])
    if found:
        return str(Path(found[-1]).parent)
    on_path = shutil.which("pg_ctl")
    return str(Path(on_path).parent) if on_path else None


class OwnPostgres:
    """One PostgreSQL cluster on 127.0.0.1, its data and log in a directory of its own under
    the system's temporary directory (the ``postgres`` user must reach it; the soak's work
    directory is private), deleted by :meth:`stop`."""

    def __init__(self, bin_dir: str) -> None:
        self.bin_dir = bin_dir
        self.directory = Path(tempfile.mkdtemp(prefix="signals-soak-pg-"))
        self.port = free_port()
        self.restarts = 0
        self._user = "postgres" if os.geteuid() == 0 else None
        self._running = False

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/soak"

    def _run(self, tool: str, *args: str, check: bool = True) -> None:
        cmd = [os.path.join(self.bin_dir, tool), *args]
        if self._user is not None:
            cmd = ["runuser", "-u", self._user, "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if check and done.returncode != 0:
            raise RuntimeError(f"{tool} failed: {done.stderr.strip()[-1500:]}")

    def _pg_ctl(self, *args: str, check: bool = True) -> None:
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.directory} "
                   f"-c max_connections=300 -c fsync=on")
        self._run("pg_ctl", "-D", str(self.directory / "data"), "-l",
                  str(self.directory / "postgres.log"), "-o", options, *args, check=check)

    def _start(self) -> None:
        if not (self.directory / "data").exists():
            self.directory.chmod(0o755)
            if self._user is not None:
                shutil.chown(self.directory, self._user)
            self._run("initdb", "-D", str(self.directory / "data"), "-U", "postgres",
                      "--auth=trust")
            self._pg_ctl("-w", "start")
            self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                      "soak")
        else:
            self._pg_ctl("-w", "start")
        self._running = True

    async def start(self) -> None:
        await anyio.to_thread.run_sync(self._start)

    async def restart(self) -> None:
        """Stop (``immediate`` and ``fast`` in turn) and start again on the same port."""
        mode = "immediate" if self.restarts % 2 == 0 else "fast"
        await anyio.to_thread.run_sync(lambda: self._pg_ctl("-m", mode, "-w", "stop"))
        self._running = False
        await self.start()
        self.restarts += 1

    async def ensure_running(self) -> None:
        if not self._running:
            await self.start()

    async def stop(self) -> None:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(
                lambda: self._pg_ctl("-m", "immediate", "-w", "stop", check=False))
        self._running = False
        shutil.rmtree(self.directory, ignore_errors=True)
