"""Every example runs as a user would run it (a subprocess) and prints what it promises."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def run_example(
    name: str, *args: str, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )
    return result


def check_agent_transcript(out: str) -> None:
    assert re.search(r"send .*'hello'.* -> wake .*run#1 starts", out), out
    assert re.search(r"agent run#1 \(token \S+\) got user\s+\"hello\"", out), out
    assert re.search(r"send .*'and another thing'.* -> deliver .*to the active run#1", out), out
    assert re.search(r"agent run#1 \(token \S+\) got user\s+\"and another thing\"", out), out
    assert "duplicate id 'msg-2': nothing stored, processed once" in out, out
    assert re.search(r"send .*if_active='queue'.* -> queued .*kept for the next run", out), out
    assert "lease handoff run#1 -> run#2 by transfer_lease" in out, out
    assert re.search(r"agent run#2 \(token \S+\) got task\s+\"summarise the conversation\"", out)
    assert re.search(r"send .*if_idle='discard'.* -> discarded", out), out
    assert "run#1 processed 2 signal(s)" in out, out
    assert "run#2 processed 1 signal(s)" in out, out
    assert "signals processed: 3, distinct ids: 3" in out, out
    ops = re.findall(r"^  (acquire|transfer|release)\s+(.*)$", out, flags=re.M)
    assert [op for op, _ in ops] == ["acquire", "transfer", "release"], ops
    assert ops[1][1].startswith("run#1 -> run#2 (ok)"), ops
    assert "lease owner now: none (released)" in out, out


def test_agent_in_memory() -> None:
    result = run_example("agent.py")
    assert result.returncode == 0, result.stderr
    assert "(in memory)" in result.stdout
    check_agent_transcript(result.stdout)
    # tokens: the handoff gave the second run a larger token
    tokens = [int(t) for t in re.findall(r"agent run#\d \(token (\d+)\)", result.stdout)]
    assert tokens == sorted(tokens) and tokens[0] < tokens[-1], tokens


def test_agent_in_memory_on_trio() -> None:
    result = run_example("agent.py", "--trio")
    assert result.returncode == 0, result.stderr
    check_agent_transcript(result.stdout)


@pytest.mark.redis
def test_agent_on_redis(redis_url: str) -> None:
    result = run_example("agent.py", "--redis-url", redis_url)
    assert result.returncode == 0, result.stderr
    assert "(Redis, prefix" in result.stdout
    check_agent_transcript(result.stdout)


@pytest.mark.redis
@pytest.mark.slow
def test_multiprocess(redis_url: str) -> None:
    result = run_example("multiprocess.py", "--redis-url", redis_url, "--processes", "3")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert len(re.findall(r"send -> wake", out)) == 1, out
    assert len(re.findall(r"send -> deliver", out)) == 2, out
    assert "wakes: 1; signals sent: 3; processed: 3 (3 distinct)" in out
    assert "processes that ran the agent: 1" in out
    assert "OK: exactly one process woke and ran every signal exactly once" in out


def test_multiprocess_without_redis_explains() -> None:
    env = {**os.environ, "PATH": "/nonexistent"}
    result = run_example("multiprocess.py", env=env, timeout=60)
    assert result.returncode == 2
    assert "redis-server is not on PATH" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.redis
@pytest.mark.slow
def test_serverless(redis_url: str) -> None:
    result = run_example("serverless.py", "--redis-url", redis_url, "--invocations", "3")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    part1, part2 = out.split("== part 2")
    assert "invocation-0: send -> wake" in part1
    assert len(re.findall(r"send -> deliver \(exited right after send\)", part1)) == 2, out
    assert "sent 3, processed 3, lost 0: OK" in part1, out
    # invocations run one after another, so the inbox (and the run) order is the send order
    assert re.findall(r"processed (thread-a-signal-\d) by invocation-0", part1) == [
        f"thread-a-signal-{i}" for i in range(3)
    ], out
    assert "invocation-0: send -> wake" in part2
    assert "SIGKILL" in part2
    assert "invocation-1: send -> deliver (invocation-0 holds the lease)" in part2, out
    assert re.search(r"invocation-2: send -> wake, ran and exited", part2), out
    assert "lost 0: OK" in part2, out
    # the killed run's signal (never committed) is processed again by the next owner, first
    assert re.findall(r"processed (thread-b-signal-\d) by invocation-2", part2) == [
        f"thread-b-signal-{i}" for i in range(3)
    ], out
    assert "OK: no signal lost" in out


@pytest.mark.redis
def test_serverless_sender(redis_url: str) -> None:
    result = run_example("serverless_sender.py", "--redis-url", redis_url, "--senders", "4")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert re.findall(r"sender-[01]: send -> (\w+)", out) == ["queued", "queued"], out
    assert len(re.findall(r"sender-[23]: send -> (?:deliver|queued)", out)) == 2, out
    assert "sent 4, processed 4, lost 0: OK" in out, out


def test_stream_chat_in_memory() -> None:
    result = run_example("stream_chat.py")
    assert result.returncode == 0, result.stderr
    assert "queued (a worker will run it)" in result.stdout
    assert "answer: Signals go in, parts come out" in result.stdout
    assert "receipt: processed" in result.stdout


@pytest.mark.redis
def test_stream_chat_across_two_processes(redis_url: str) -> None:
    result = run_example("stream_chat.py", "--redis-url", redis_url)
    assert result.returncode == 0, result.stderr
    assert "answer: Signals go in, parts come out" in result.stdout
    assert "receipt: processed" in result.stdout


def test_control_in_memory() -> None:
    result = run_example("control.py")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "cancel step-3: ['step-3']" in out
    assert "interrupt with a correction: deliver" in out
    assert "abort the long run: True" in out
    assert "('run.cancelled', {'reason': 'abort: taking too long'})" in out
    assert "poison signal: dead_lettered (ValueError: cannot handle this one)" in out
    assert "dead letters: [('bad', 2)]" in out


def check_dispositions(out: str) -> None:
    got = re.findall(r"agent got (\w+)", out)
    assert got == ["user", "browser", "typing", "ci", "ci", "ci", "ci", "ci"], out
    assert "send page-1     -> queued, supersedes page-0" in out, out
    assert "send page-2     -> unchanged" in out, out
    assert "send msg-1      -> queued, drops ci-0" in out, out
    assert "{'text': 'fix'}  (folds key-0, key-1, key-2)" in out, out
    assert "receipt of page-0: superseded by page-1" in out, out
    assert "receipt of ci-0: dropped" in out, out
    assert "receipt of key-1: processed" in out, out


def test_dispositions_in_memory() -> None:
    result = run_example("dispositions.py")
    assert result.returncode == 0, result.stderr
    check_dispositions(result.stdout)


def test_dispositions_on_sqlite(tmp_path: Path) -> None:
    result = run_example("dispositions.py", "--sqlite", str(tmp_path / "d.db"))
    assert result.returncode == 0, result.stderr
    check_dispositions(result.stdout)


@pytest.mark.redis
def test_dispositions_on_redis(redis_url: str) -> None:
    result = run_example("dispositions.py", "--redis-url", redis_url)
    assert result.returncode == 0, result.stderr
    check_dispositions(result.stdout)


def test_sqlite_workers() -> None:
    result = run_example("sqlite_workers.py")
    assert result.returncode == 0, result.stderr
    assert re.search(r"thread-a runs in pid \d+; SIGKILL it", result.stdout), result.stdout
    assert "all 30 signals processed" in result.stdout, result.stdout


def test_time_agent(tmp_path: Path) -> None:
    for args in ((), ("--sqlite", str(tmp_path / "t.db"))):
        result = run_example("time_agent.py", *args)
        assert result.returncode == 0, result.stderr
        out = result.stdout
        assert "schedules: ['daily-digest', 'demo-digest']" in out, out
        assert "reminder in 2 s: scheduled" in out, out
        assert re.search(r"agent got typing +\{'text': 'hello'\}", out), out
        assert re.search(r" 2\.\d s  agent got reminder", out), out
        assert len(re.findall(r"agent got digest", out)) == 2, out
        assert "the CI status sent to a paused thread: expired" in out, out
        assert "unschedule demo-digest: True" in out, out
