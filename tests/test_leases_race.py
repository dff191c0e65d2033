"""50 OS processes race ``acquire_lease`` for one key on the shared Redis: one winner."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

pytestmark = [pytest.mark.redis, pytest.mark.slow]

WORKER = Path(__file__).with_name("lease_race_worker.py")
CONTENDERS = 50


def test_fifty_processes_one_winner(redis_url: str, key_prefix: str) -> None:
    control = redis.Redis.from_url(redis_url)
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), redis_url, key_prefix, "thread-1", f"proc-{i}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=WORKER.parent.parent,
        )
        for i in range(CONTENDERS)
    ]
    try:
        deadline = time.monotonic() + 60
        while int(control.get(f"{key_prefix}:ready") or 0) < CONTENDERS:
            assert time.monotonic() < deadline, "contenders did not all start"
            assert all(p.poll() is None for p in procs), "a contender died at start"
            time.sleep(0.02)
        # One command wakes every blocked contender at once.
        control.rpush(f"{key_prefix}:go", *["go"] * CONTENDERS)
        outputs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        control.close()
    assert all(p.returncode == 0 for p in procs), [err.decode() for _, err in outputs]
    results = [json.loads(out) for out, _ in outputs]
    winners = [r["owner"] for r in results if r["acquired"]]
    assert len(winners) == 1, winners
    (winner,) = winners
    assert all(r["reported_owner"] == winner for r in results)
    assert [r["token"] for r in results if r["acquired"]] == [1]
    assert {r["owner"] for r in results} == {f"proc-{i}" for i in range(CONTENDERS)}
