"""SQLite for every layer: one database file on one host, shared by any number of processes.

The file is opened in WAL mode (readers beside one writer) with ``synchronous=FULL`` (a
commit survives a power loss) and a busy timeout; a write transaction takes the write lock
up front (``BEGIN IMMEDIATE``), so two writers never deadlock upgrading a read lock.

**The clock.** Leases expire by one clock that every process on the host shares and that never
jumps: the kernel's monotonic clock (``time.monotonic()``, ``CLOCK_MONOTONIC`` on Linux, the
same in every process of one boot). Its zero is anchored once per boot to the wall time of the
boot (``boot_ms``, kept in the file per boot id) and never earlier than the latest lease expiry
written before the boot, so a lease from before a reboot is always over after it, and an NTP
step of the wall clock never shortens or stretches a lease. The boot id is Linux's; elsewhere
it is the boot's wall time to the minute, which a sleeping or NTP-slewed host can move: there,
keep one host's processes on one boot's clock (no suspend while they run).
Due times of signals and receipts use wall time (they are Unix times by contract).
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from _signal_leases.errors import BackendError, BackendPermanentError, BackendUnavailableError
from _signal_leases.sql import Database

__all__ = ["SQLiteDatabase", "boot_id"]


def boot_id() -> str:
    """This boot of the host: Linux's boot id, else the boot's wall time to the minute."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return f"boot-{round((time.time() - time.monotonic()) / 60)}"


class SQLiteDatabase(Database):
    """A SQLite database file (see the module docstring).

    ``path`` must name a file in an existing, writable directory; the file is created when
    missing. A missing directory, a read-only location or a file that is not a SQLite database
    raises :class:`~_signal_leases.errors.BackendPermanentError` naming the path, on first use.
    """

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout_ms: int = 10_000,
                 max_connections: int = 4) -> None:
        super().__init__(max_connections=max_connections)
        self.path = os.path.abspath(os.fspath(path))
        self.busy_timeout_ms = busy_timeout_ms
        self._boot_ms: int | None = None

    @property
    def name(self) -> str:
        return repr(self.path)

    def check_path(self) -> None:
        """Raise :class:`BackendPermanentError` naming the path when no database can be there
        (a missing directory, no access); never opens the file (see below)."""
        folder = os.path.dirname(self.path)
        if not os.path.isdir(folder):
            raise BackendPermanentError(
                f"SQLite database {self.path!r}: the directory {folder!r} does not exist"
            )
        # Never open the file here: closing any descriptor of it drops every POSIX lock this
        # process holds on it, those of its SQLite connections too. Another process that
        # closes its last connection then finds the file free, checkpoints and deletes the
        # WAL under this process's connections, whose later commits go to a deleted file
        # (lost, and a malformed database). A file that is not a database is named by the
        # first connection instead (``map_error``).
        if os.path.exists(self.path):
            if not os.access(self.path, os.R_OK | os.W_OK):
                raise BackendPermanentError(
                    f"SQLite database {self.path!r} is not readable and writable by this user"
                )
        elif not os.access(folder, os.W_OK):
            raise BackendPermanentError(
                f"SQLite database {self.path!r}: cannot create it, the directory {folder!r} "
                f"is not writable"
            )

    def connect(self) -> Any:
        self.check_path()
        conn = sqlite3.connect(self.path, timeout=self.busy_timeout_ms / 1000,
                               isolation_level=None, check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}")
            self._wal(conn)
            conn.execute("PRAGMA synchronous=FULL")
            if self._boot_ms is None:
                self._boot_ms = self._anchor(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _wal(self, conn: sqlite3.Connection) -> None:
        """Switch the file to WAL (once per file; later connections find it so). The switch
        needs the file to itself and does not wait on the busy handler: retry it while other
        connections of the first moments hold it, within the busy timeout."""
        deadline = time.monotonic() + self.busy_timeout_ms / 1000
        while True:
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.005)

    def _anchor(self, conn: sqlite3.Connection) -> int:
        """The wall time (ms) of this boot, as the first process of the boot recorded it."""
        me = boot_id()
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("CREATE TABLE IF NOT EXISTS host_clock "
                         "(id INTEGER PRIMARY KEY CHECK (id = 0), boot TEXT, boot_ms INTEGER)")
            row = conn.execute("SELECT boot, boot_ms FROM host_clock WHERE id = 0").fetchone()
            if row is not None and row[0] == me:
                base = int(row[1])
            else:
                mono = int(time.monotonic() * 1000)
                base = int(time.time() * 1000) - mono
                if row is not None:
                    # After a reboot: later than every expiry written before it, even with a
                    # wall clock that is behind at boot (a dead RTC, a restored snapshot).
                    base = max(base, int(row[1]) + 1, self._latest_expiry(conn) + 1 - mono)
                conn.execute("INSERT OR REPLACE INTO host_clock (id, boot, boot_ms) "
                             "VALUES (0, ?, ?)", (me, base))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return base

    @staticmethod
    def _latest_expiry(conn: sqlite3.Connection) -> int:
        """The latest lease or session expiry in the file (0: none)."""
        latest = 0
        for table in ("leases", "lease_sessions"):
            if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                            (table,)).fetchone():
                found = conn.execute(f"SELECT MAX(expires_ms) FROM {table}").fetchone()[0]
                latest = max(latest, int(found or 0))
        return latest

    def now_ms(self) -> int:
        """The host clock of the module docstring, in ms (after the first connection)."""
        assert self._boot_ms is not None
        return self._boot_ms + int(time.monotonic() * 1000)

    def begin(self, cursor: Any, write: bool) -> tuple[int, float]:
        cursor.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        return self.now_ms(), time.time()

    def map_error(self, exc: Exception, what: str) -> BackendError | None:
        if isinstance(exc, BackendError):
            return exc
        if not isinstance(exc, sqlite3.Error):
            return None
        text = str(exc)
        if isinstance(exc, sqlite3.OperationalError) and (
            "locked" in text or "busy" in text or "disk I/O" in text
        ):
            return BackendUnavailableError(f"SQLite database {self.path!r} busy during {what}: "
                                           f"{text}")
        if "not a database" in text or "malformed" in text:
            return BackendPermanentError(f"{self.path!r} is not a SQLite database ({text})")
        if "readonly" in text or "unable to open" in text:
            return BackendPermanentError(f"SQLite database {self.path!r} cannot be written "
                                         f"({text})")
        return BackendPermanentError(f"SQLite database {self.path!r} refused {what}: {text}")
