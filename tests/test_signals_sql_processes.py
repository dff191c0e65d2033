"""The runtime on the SQL backends with real processes: one SQLite file, or one PostgreSQL
database. Owners SIGKILLed mid-run, a full restart of every process, a Postgres restart
(fast and immediate) mid-run, tokens that only grow per thread, bad paths named."""

from __future__ import annotations

import json
import os
import signal as os_signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import anyio
import pytest

from _signal_leases.errors import BackendPermanentError
from pubsub import SQLitePubSub
from signals import SignalRuntime
from tests._postgres_server import PostgresServer

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> list[str]:
    """The worker's backend arguments: a SQLite file, or a schema on the session's Postgres."""
    if request.param == "sqlite":
        return ["--sqlite", str(tmp_path / "agents.db")]
    dsn = request.getfixturevalue("postgres_dsn")
    return ["--postgres", dsn, "--schema", request.getfixturevalue("pg_schema")]


def _proc(backend: list[str], out: Path, *args: str) -> subprocess.Popen[str]:
    """A ``tests.sql_worker`` process; its stderr goes to ``out/stderr-<n>.txt``."""
    n = len(list(out.glob("stderr-*.txt")))
    with open(out / f"stderr-{n}-{args[0]}.txt", "w") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.sql_worker", *args, *backend, "--out", str(out)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )


def _finished(proc: subprocess.Popen[str], out: Path, timeout: float) -> None:
    """Wait for a sender; it must exit 0 (else the stderr of every process, for the report)."""
    proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"the sender exited with {proc.returncode}\n{_logs(out)}")


def _logs(out: Path) -> str:
    """The end of every process's stderr, for a failure's report."""
    return "\n".join(f"== {p.name}\n{p.read_text()[-2000:]}"
                     for p in sorted(out.glob("stderr-*.txt")))


def _ready(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert json.loads(line)["event"] == "ready", line


def _receipts(backend: list[str], out: Path, n: int, timeout: float) -> int:
    proc = _proc(backend, out, "receipts", str(n), str(timeout))
    stdout, _ = proc.communicate(timeout=timeout + 60)
    return int(stdout.strip().splitlines()[-1])


def _seen(out: Path) -> list[dict[str, object]]:
    rows = []
    for path in out.glob("seen-*.jsonl"):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


def _check_tokens(out: Path, n: int) -> None:
    seen = _seen(out)
    assert {row["id"] for row in seen} == {f"s{i}" for i in range(n)}
    tokens: dict[str, list[int]] = defaultdict(list)
    for row in seen:  # per thread, in the order each process wrote them
        tokens[str(row["t"])].append(int(row["tok"]))  # type: ignore[call-overload]
    assert all(tok > 0 for toks in tokens.values() for tok in toks)


@pytest.mark.slow
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_owners_killed_twice_lose_nothing(anyio_backend: str, backend: list[str],
                                                tmp_path: Path) -> None:
    out = tmp_path
    a, b = _proc(backend, out, "serve", "60"), _proc(backend, out, "serve", "60")
    try:
        _ready(a)
        _ready(b)
        sender = _proc(backend, out, "send", "0", "300", "0.02")
        for _ in range(2):
            await anyio.sleep(2)
            a.send_signal(os_signal.SIGKILL)
            a.communicate()
            a = _proc(backend, out, "serve", "60")
            _ready(a)
        _finished(sender, out, 120)
        assert _receipts(backend, out, 300, 60) == 300, _logs(out)
    finally:
        for p in (a, b):
            p.kill()
            p.communicate()
    _check_tokens(out, 300)


@pytest.mark.slow
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_signals_sent_while_no_worker_runs_survive_a_full_restart(
    anyio_backend: str, backend: list[str], tmp_path: Path
) -> None:
    out = tmp_path
    sender = _proc(backend, out, "send", "0", "20", "0")
    _finished(sender, out, 60)
    worker = _proc(backend, out, "serve", "30")
    try:
        _ready(worker)
        assert _receipts(backend, out, 20, 30) == 20, _logs(out)
    finally:
        worker.kill()
        worker.communicate()


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_a_postgres_restart_mid_run_loses_nothing(
    anyio_backend: str, mode: str, private_postgres_server: PostgresServer, tmp_path: Path
) -> None:
    """Two workers and a sender; the owner of a thread SIGKILLed, then Postgres restarted
    (``fast``: clients told; ``immediate``: as after a crash) while signals flow. Senders that
    got ``BackendUnavailableError`` retry with the same id; every signal is processed."""
    backend, out = ["--postgres", private_postgres_server.dsn], tmp_path
    a, b = _proc(backend, out, "serve", "90"), _proc(backend, out, "serve", "90")
    try:
        _ready(a)
        _ready(b)
        sender = _proc(backend, out, "send", "0", "300", "0.02")
        await anyio.sleep(2)
        a.send_signal(os_signal.SIGKILL)
        a.communicate()
        a = _proc(backend, out, "serve", "90")
        _ready(a)
        await anyio.to_thread.run_sync(private_postgres_server.restart, mode)
        _finished(sender, out, 180)
        assert _receipts(backend, out, 300, 90) == 300, _logs(out)
    finally:
        for p in (a, b):
            p.kill()
            p.communicate()
    _check_tokens(out, 300)


async def test_bad_paths_are_named(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "dir" / "x.db"
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    for path in (missing, junk):
        with pytest.raises(BackendPermanentError) as caught:
            async with SQLitePubSub(path):
                pass
        assert str(path.parent if path is missing else path) in str(caught.value)
        with pytest.raises(BackendPermanentError):
            async with SQLitePubSub(path) as ps, SignalRuntime(pubsub=ps, agent=None) as rt:
                await rt.send("t", "x")
    assert junk.read_bytes().startswith(b"this is not sqlite")  # left alone


async def test_a_runtime_on_sqlite_runs_on_asyncio_and_trio(tmp_path: Path) -> None:
    got: list[str] = []

    async def agent(run: object) -> None:
        async for s in run:  # type: ignore[attr-defined]
            got.append(s.id)
            await run.ack(s)  # type: ignore[attr-defined]

    async with SQLitePubSub(tmp_path / "a.db") as ps, SignalRuntime(pubsub=ps, agent=agent) as rt:
        start = time.monotonic()
        for i in range(5):
            await rt.send("t", f"m{i}")
        with anyio.fail_after(10):
            await rt.wait_idle()
    assert len(got) == 5 and time.monotonic() - start < 10
