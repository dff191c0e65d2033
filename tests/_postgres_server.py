"""Start and stop a real PostgreSQL on a free loopback port, for the test suite.

Debian's ``postgresql`` package: ``initdb`` into a temporary directory and ``pg_ctl`` on a free
port, with trust authentication on loopback and one database, ``signals``. PostgreSQL refuses
to run as root, so when the suite runs as root the server runs as the ``postgres`` user (which
the package creates) through ``runuser``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from signals.soak.postgres_server import postgres_bin_dir
from tests._redis_server import free_port

__all__ = ["PostgresServer", "postgres_bin_dir"]


class PostgresServer:
    """One PostgreSQL cluster in a temporary directory, listening on 127.0.0.1 only.

    ``restart(mode)`` stops it (``fast``: clients are disconnected, or ``immediate``: no
    shutdown checkpoint, as after a crash) and starts it again on the same port.
    """

    def __init__(self, bin_dir: str, *, port: int | None = None) -> None:
        self.bin_dir = bin_dir
        self.port = port or free_port()
        self._dir = Path(tempfile.mkdtemp(prefix="pg-test-"))
        self._data = self._dir / "data"
        self._user = "postgres" if os.geteuid() == 0 else None

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/signals"

    def _run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [os.path.join(self.bin_dir, tool), *args]
        if self._user is not None:
            cmd = ["runuser", "-u", self._user, "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=120)

    def _options(self) -> str:
        return (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self._dir} "
                f"-c max_connections=300 -c fsync=on -c log_min_messages=warning")

    def start(self) -> None:
        if not self._data.exists():
            self._dir.chmod(0o755)
            if self._user is not None:
                shutil.chown(self._dir, self._user)
            self._run("initdb", "-D", str(self._data), "-U", "postgres", "--auth=trust",
                      "--no-sync")
        self._run("pg_ctl", "-D", str(self._data), "-l", str(self._dir / "log"), "-o",
                  self._options(), "-w", "start")
        if self._run("psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                     "-tAc", "SELECT 1 FROM pg_database WHERE datname = 'signals'",
                     check=False).stdout.strip() != "1":
            self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                      "signals")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self._data), "-m", mode, "-w", "stop", check=False)

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def psql(self, sql: str) -> str:
        """Run ``sql`` as the superuser on the ``signals`` database; its output."""
        return self._run("psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                         "-d", "signals", "-tAc", sql).stdout

    def __enter__(self) -> PostgresServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop("immediate")
        shutil.rmtree(self._dir, ignore_errors=True)
