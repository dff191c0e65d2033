"""The runtime on one SQLite file shared by real processes: owners SIGKILLed mid-run, a full
restart of every process, tokens that only grow per thread, bad paths named."""

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

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent


def _proc(db: Path, out: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.sql_worker", *args, "--sqlite", str(db), "--out", str(out)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _ready(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert json.loads(line)["event"] == "ready", line


def _receipts(db: Path, out: Path, n: int, timeout: float) -> int:
    proc = _proc(db, out, "receipts", str(n), str(timeout))
    stdout, _ = proc.communicate(timeout=timeout + 60)
    return int(stdout.strip().splitlines()[-1])


def _seen(out: Path) -> list[dict[str, object]]:
    rows = []
    for path in out.glob("seen-*.jsonl"):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_owners_killed_twice_lose_nothing(anyio_backend: str, tmp_path: Path) -> None:
    db, out = tmp_path / "agents.db", tmp_path
    a, b = _proc(db, out, "serve", "60"), _proc(db, out, "serve", "60")
    try:
        _ready(a)
        _ready(b)
        sender = _proc(db, out, "send", "0", "300", "0.02")
        for _ in range(2):
            await anyio.sleep(2)
            a.send_signal(os_signal.SIGKILL)
            a.communicate()
            a = _proc(db, out, "serve", "60")
            _ready(a)
        sender.communicate(timeout=120)
        assert _receipts(db, out, 300, 60) == 300
    finally:
        for p in (a, b):
            p.kill()
            p.communicate()
    seen = _seen(out)
    assert {row["id"] for row in seen} == {f"s{i}" for i in range(300)}
    tokens: dict[str, list[int]] = defaultdict(list)
    for row in seen:  # per thread, in the order each process wrote them
        tokens[str(row["t"])].append(int(row["tok"]))  # type: ignore[call-overload]
    assert all(tok > 0 for toks in tokens.values() for tok in toks)


@pytest.mark.slow
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_signals_sent_while_no_worker_runs_survive_a_full_restart(
    anyio_backend: str, tmp_path: Path
) -> None:
    db, out = tmp_path / "agents.db", tmp_path
    sender = _proc(db, out, "send", "0", "20", "0")
    sender.communicate(timeout=60)
    assert sender.returncode == 0
    worker = _proc(db, out, "serve", "30")
    try:
        _ready(worker)
        assert _receipts(db, out, 20, 30) == 20
    finally:
        worker.kill()
        worker.communicate()


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
