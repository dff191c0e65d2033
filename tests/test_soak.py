"""``python -m signals.soak``: the tool runs, and each figure of its verdict is computed soundly.

The soaks themselves run as subprocesses (the soak configures logging and starts processes of
its own); the verifier, the fence store and the proxy are checked directly on small inputs
where the right answer is known.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
import pytest

from pubsub import RedisStreamsPubSub, SQLitePubSub
from signals._model import Receipt
from signals.kit import SQLCore
from signals.soak import FactoryContext, SoakBackend
from signals.soak._main import parse_options
from signals.soak.fleet import Exit, Fleet, KillEvent
from signals.soak.proxy import Route
from signals.soak.record import FenceStore, Recorder, read_fence_logs
from signals.soak.run import Facts
from signals.soak.verify import verify
from tests._redis_server import redis_server_binary

ROOT = Path(__file__).resolve().parent.parent


def _soak(*args: str, timeout: float) -> tuple[int, dict[str, Any], str]:
    """Run ``python -m signals.soak ... --json``; (exit status, result, stderr)."""
    result = subprocess.run(
        [sys.executable, "-m", "signals.soak", *args, "--json"], capture_output=True, text=True,
        timeout=timeout, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.stdout.strip(), f"no JSON on stdout; stderr:\n{result.stderr[-3000:]}"
    return result.returncode, json.loads(result.stdout), result.stderr


def _require_redis_server() -> None:
    """Skip without redis-server locally; fail with CI=true (the conftest's rule)."""
    if redis_server_binary() is None:
        msg = "redis-server is not installed (apt-get install -y redis-server)"
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail(f"CI=true and {msg}", pytrace=False)
        pytest.skip(msg)


def _assert_passed(code: int, result: dict[str, Any], stderr: str) -> None:
    """The soak's verdict: no overlap, no token back, no worker crash, nothing lost."""
    summary = stderr.rstrip().splitlines()[-1] if stderr.strip() else ""
    figures = f"{summary}\n{json.dumps(result, indent=1)[:6000]}\n{stderr[-3000:]}"
    assert result["overlaps"] == 0, figures
    assert result["token_violations"] == 0, figures
    assert result["faults"]["worker_crashes"] == 0, figures
    assert result["lost"] == 0, figures
    assert code == 0 and summary.startswith("soak PASSED: "), figures


def soak_factory(ctx: FactoryContext) -> RedisStreamsPubSub:
    """A custom backend for ``--backend tests.test_soak:soak_factory`` (here: Redis again)."""
    assert ctx.url is not None and ctx.role in ("worker", "sender")
    return RedisStreamsPubSub(url=ctx.url, key_prefix=ctx.key_prefix,
                              socket_timeout=ctx.ttl_ms / 3000)


def sqlite_store_apart(ctx: FactoryContext) -> SoakBackend:
    """``--backend tests.test_soak:sqlite_store_apart``: a pub/sub with its store passed as
    ``inbox=`` (an unfused core: notices over the pub/sub, leases through the provider)."""
    pubsub = SQLitePubSub(str(Path(tempfile.gettempdir()) / f"{ctx.key_prefix}.db"))
    return SoakBackend(pubsub, leases=pubsub.get_lease_provider(),
                       inbox=SQLCore(pubsub.sql_database))


# -- the soak, end to end ------------------------------------------------------------------


def test_memory_soak_runs_in_seconds_and_loses_nothing() -> None:
    code, result, stderr = _soak("--backend", "memory", "--seconds", "3", "--workers", "3",
                                 "--threads", "8", "--seed", "1", timeout=60)
    assert code == 0, stderr[-3000:]
    assert result["ok"] is True
    assert result["signals"]["checked"] > 50
    assert result["processed"] == result["signals"]["checked"]
    assert result["lost"] == 0 and result["overlaps"] == 0 and result["token_violations"] == 0
    assert result["signals"]["repeats_refused_as_duplicate"] == result["signals"]["repeats_sent"]
    assert result["faults"]["kills"] == 0
    assert stderr.rstrip().splitlines()[-1].startswith("soak PASSED: ")


@pytest.mark.parametrize(
    "args",
    [["--backend", "nowhere"], ["--backend", "no_such_module_x:f"], ["--backend", "cluster"],
     ["--workers", "0"], ["--seconds", "-1"]],
    ids=["not-a-backend", "unimportable-factory", "cluster-without-url", "no-workers",
         "negative-seconds"],
)
def test_bad_options_are_usage_errors(args: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_options(args)
    assert exc.value.code == 2


@pytest.mark.redis
@pytest.mark.slow
def test_custom_backend_factory_is_soaked(redis_url: str) -> None:
    code, result, stderr = _soak(
        "--backend", "tests.test_soak:soak_factory", "--redis-url", redis_url, "--seconds", "8",
        "--workers", "2", "--threads", "4", "--kill-every", "2", "--ttl-ms", "1000",
        "--rate", "20", "--seed", "3", timeout=180,
    )
    assert result["faults"]["kills"] >= 2
    assert result["faults"]["redis_restarts"] == 0 and result["faults"]["blackholes"] == 0
    _assert_passed(code, result, stderr)


@pytest.mark.slow
def test_bounded_sqlite_soak_with_kills() -> None:
    code, result, stderr = _soak(
        "--backend", "sqlite", "--seconds", "10", "--workers", "2", "--threads", "4",
        "--kill-every", "2", "--ttl-ms", "1000", "--rate", "20", "--seed", "5", timeout=180,
    )
    assert result["faults"]["kills"] >= 3
    assert result["processed"] > 100
    _assert_passed(code, result, stderr)


@pytest.mark.slow
@pytest.mark.postgres
def test_bounded_postgres_soak_with_kills_and_restarts(postgres_server: Any) -> None:
    """The soak's own PostgreSQL (binaries of the session's server), restarted immediate and
    fast in turn, while owners are SIGKILLed."""
    code, result, stderr = _soak(
        "--backend", "postgres", "--seconds", "20", "--workers", "3", "--threads", "6",
        "--kill-every", "2", "--restart-server-every", "6", "--ttl-ms", "1500",
        "--rate", "20", "--seed", "7", timeout=300,
    )
    assert result["faults"]["kills"] >= 5 and result["faults"]["redis_restarts"] >= 2
    assert result["processed"] > 200
    _assert_passed(code, result, stderr)


@pytest.mark.slow
def test_a_custom_backend_with_its_store_apart_is_soaked() -> None:
    code, result, stderr = _soak(
        "--backend", "tests.test_soak:sqlite_store_apart", "--seconds", "8", "--workers", "2",
        "--threads", "4", "--kill-every", "2", "--ttl-ms", "1000", "--rate", "20",
        "--seed", "6", timeout=180,
    )
    prefix = result["settings"]["key_prefix"]
    for leftover in Path(tempfile.gettempdir()).glob(f"{prefix}.db*"):
        leftover.unlink()
    assert result["faults"]["kills"] >= 2
    _assert_passed(code, result, stderr)


@pytest.mark.redis
@pytest.mark.slow
def test_bounded_redis_soak_with_kills_a_restart_and_a_black_hole() -> None:
    """About 60 s of faults on the soak's own redis-server (AOF): at least 20 SIGKILLs of
    owners, one Redis restart, two black holes; nothing lost, no overlap, no token back."""
    _require_redis_server()
    code, result, stderr = _soak(
        "--backend", "redis", "--seconds", "60", "--workers", "3", "--threads", "12",
        "--kill-every", "2.5", "--restart-redis-every", "35", "--blackhole-every", "25",
        "--blackhole-seconds", "3", "--ttl-ms", "2000", "--rate", "25", "--seed", "7",
        timeout=400,
    )
    faults = result["faults"]
    assert faults["kills"] >= 20
    assert faults["redis_restarts"] >= 1
    assert faults["blackholes"] >= 1
    assert result["signals"]["checked"] > 500
    assert result["takeover_s"]["count"] >= 10
    _assert_passed(code, result, stderr)
    assert result["processed"] == result["signals"]["checked"]


# -- the verifier, on records whose answer is known ----------------------------------------


def _facts(tmp_path: Path, records: list[dict[str, Any]], *, accepted: dict[str, str],
           receipts: dict[str, Receipt | None], fleet: Fleet | None = None) -> Facts:
    options = parse_options(["--backend", "redis", "--seed", "1"])
    (tmp_path / "records").mkdir(exist_ok=True)
    recorder = Recorder(tmp_path / "records" / "w00-1.jsonl")
    for record in records:
        recorder.write(**record)
    recorder.close()
    facts = Facts(options, tmp_path, "p", "r", fleet=fleet, ended_at=1000.0)
    facts.sends.accepted.update(accepted)
    facts.receipts.update(receipts)
    return facts


def _run(thread: str, run: str, pid: int, token: int, start: float,
         end: float | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"k": "start", "th": thread, "run": run, "rt": run.split("/")[0], "tok": token,
         "pid": pid, "t": start}
    ]
    if end is not None:
        out.append({"k": "end", "th": thread, "run": run, "rt": run.split("/")[0], "pid": pid,
                    "t": end, "how": "finished"})
    return out


def _sig(thread: str, sid: str, run: str, token: int, s: float, e: float,
         fence: tuple[bool, ...] = (True, True)) -> list[dict[str, Any]]:
    return [
        {"k": "got", "th": thread, "id": sid, "run": run, "t": s},
        {"k": "sig", "th": thread, "id": sid, "run": run, "rt": run.split("/")[0], "tok": token,
         "pid": 1, "s": s, "e": e, "att": 1, "fence": list(fence)},
    ]


def _processed(sid: str, run: str) -> Receipt:
    return Receipt(sid, "processed", run)


def test_verifier_passes_clean_records(tmp_path: Path) -> None:
    records = [*_run("t", "a/1", 1, 1, 10.0, 11.0), *_sig("t", "s1", "a/1", 1, 10.1, 10.2),
               *_run("t", "b/1", 2, 2, 11.5, 12.0), *_sig("t", "s2", "b/1", 2, 11.6, 11.7),
               *_sig("t", "s2", "b/1", 2, 11.8, 11.9)]
    result = verify(_facts(tmp_path, records, accepted={"s1": "t", "s2": "t"},
                           receipts={"s1": _processed("s1", "a/1"),
                                     "s2": _processed("s2", "b/1")}))
    assert result["ok"] is True
    assert (result["lost"], result["overlaps"], result["token_violations"]) == (0, 0, 0)
    assert (result["processed"], result["duplicates"]) == (2, 1)


def test_verifier_counts_overlapping_runs_and_token_regressions(tmp_path: Path) -> None:
    records = [*_run("t", "a/1", 1, 5, 10.0, 12.0),
               *_run("t", "b/1", 2, 6, 11.0, 13.0),   # starts before a/1 ended: an overlap
               *_run("t", "c/1", 3, 4, 14.0, 15.0),   # after both, but a lower token
               *_run("u", "d/1", 4, 1, 10.0, 11.0)]   # another thread: independent
    result = verify(_facts(tmp_path, records, accepted={}, receipts={}))
    assert result["overlaps"] == 1
    assert result["overlap_examples"][0]["first"] == "a/1"
    assert result["token_violation_detail"]["run_token_regressions"] == 1
    assert result["ok"] is False


def test_a_killed_run_is_active_until_its_process_was_reaped(tmp_path: Path) -> None:
    fleet = Fleet("redis", "p", 1000, 10, 1, tmp_path, print)
    fleet.kills.append(KillEvent(0, 1, "a", at=20.0, reaped=20.1))
    fleet.exits.append(Exit(0, 1, -9, 20.1, "killed"))
    records = [*_run("t", "a/1", 1, 1, 10.0, None),   # killed: no end record
               {"k": "got", "th": "t", "id": "s1", "run": "a/1", "t": 19.0},
               *_run("t", "b/1", 2, 2, 20.05, 21.0),  # before the reap: counted as overlap
               *_run("t", "c/1", 3, 3, 22.0, 23.0), *_sig("t", "s1", "c/1", 3, 22.1, 22.2),
               # Another thread of the victim, with s2 in hand, never run again: stranded.
               *_run("v", "a/2", 1, 1, 15.0, None),
               {"k": "got", "th": "v", "id": "s2", "run": "a/2", "t": 19.5}]
    result = verify(_facts(tmp_path, records, accepted={"s1": "t", "s2": "v"},
                           receipts={"s1": _processed("s1", "c/1"),
                                     "s2": Receipt("s2", "pending")}, fleet=fleet))
    assert result["overlaps"] == 1 and result["runs_without_end_record"] == 2
    # s1 was in hand at the kill: the takeover is the next run of the thread elsewhere.
    assert result["takeover_s"]["count"] == 1
    assert result["takeover_s"]["p50"] == pytest.approx(0.05, abs=1e-3)
    assert result["takeover_s"]["not_taken_over_threads"] == ["v"]
    assert (result["lost"], result["lost_threads"]) == (1, ["v"])


def test_verifier_counts_lost_signals(tmp_path: Path) -> None:
    records = [*_run("t", "a/1", 1, 1, 10.0, 11.0), *_sig("t", "s1", "a/1", 1, 10.1, 10.2)]
    receipts: dict[str, Receipt | None] = {
        "s1": _processed("s1", "a/1"),
        "s2": Receipt("s2", "pending"),          # never processed
        "s3": _processed("s3", "a/1"),           # acknowledged, but no run did the work
        "s4": None,                              # accepted, and no receipt at all
        "s5": Receipt("s5", "dead_lettered"),
    }
    accepted = dict.fromkeys(receipts, "t")
    result = verify(_facts(tmp_path, records, accepted=accepted, receipts=receipts))
    assert result["lost"] == 4
    assert result["lost_detail"] == {"pending": 1, "acked_without_record": 1,
                                     "missing_receipt": 1, "dead_lettered": 1}
    assert result["processed"] == 2 and result["ok"] is False


def test_verifier_names_threads_nobody_took_over(tmp_path: Path) -> None:
    records = [*_run("t", "a/1", 1, 1, 10.0, None),      # its worker was killed
               *_run("u", "b/1", 2, 1, 10.0, None), *_run("w", "c/1", 3, 1, 10.0, None)]
    records.append({"k": "end", "th": "u", "run": "b/1", "rt": "b", "pid": 2, "t": 11.0,
                    "how": "cancelled"})                  # lost its lease
    fleet = Fleet("redis", "p", 1000, 10, 1, tmp_path, print)
    fleet.kills.append(KillEvent(0, 1, "a", at=12.0, reaped=12.1))
    facts = _facts(tmp_path, records, accepted={"s1": "t", "s2": "u", "s3": "w", "s4": "x"},
                   receipts={sid: Receipt(sid, "pending") for sid in ("s1", "s2", "s3", "s4")},
                   fleet=fleet)
    idle = {"last_run": None, "last_owner_killed": False, "owner_now": None, "pending": 1}
    facts.stuck.update({
        "t": idle, "u": idle,
        "w": {**idle, "owner_now": "c/1"},                # an owner holds it: not stranded
        "x": {**idle, "last_run": "d/1", "last_owner_killed": True},  # only the stream knew
    })
    result = verify(facts)
    assert result["lost_threads"] == ["t", "u", "w", "x"]
    assert result["stranded"] == ["t", "u", "x"]


def test_verifier_reads_fence_refusals_and_out_of_order_logs(tmp_path: Path) -> None:
    records = [*_run("t", "a/1", 1, 1, 10.0, 11.0),
               *_sig("t", "s1", "a/1", 1, 10.1, 10.2, fence=(True, False))]
    fence = tmp_path / "records" / "fence"
    fence.mkdir(parents=True)
    (fence / "t.log").write_text("1 3 a/1 s1 1\n2 2 a/1 s1 1\n")  # 2 accepted after 3
    result = verify(_facts(tmp_path, records, accepted={"s1": "t"},
                           receipts={"s1": _processed("s1", "a/1")}))
    assert result["fence_refusals"] == 1
    assert result["token_violation_detail"]["fenced_writes_out_of_order"] == 1


# -- the parts -----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_fence_store_refuses_a_lower_token_and_logs_in_order(tmp_path: Path) -> None:
    fence = FenceStore(tmp_path)
    outcomes = [await fence.write("t", token, f"r{token}", f"s{i}")
                for i, token in enumerate([5, 5, 7, 6, 7, 8])]
    assert outcomes == [True, True, True, False, True, True]
    assert read_fence_logs(tmp_path)["t"] == [(1, 5), (2, 5), (3, 7), (4, 7), (5, 8)]


@pytest.mark.anyio
async def test_route_black_hole_holds_traffic_and_delivers_it_on_resume() -> None:
    async def echo(stream: Any) -> None:
        async with stream:
            try:
                while True:
                    await stream.send(await stream.receive())
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                pass

    server = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = server.extra(anyio.abc.SocketAttribute.local_port)
    async with server, anyio.create_task_group() as tg:
        tg.start_soon(server.serve, echo)
        route = Route("127.0.0.1", port)
        await tg.start(route.serve)
        async with await anyio.connect_tcp("127.0.0.1", route.port) as client:
            await client.send(b"a")
            assert await client.receive() == b"a"
            route.hold()
            await client.send(b"b")
            with anyio.move_on_after(0.3) as held:
                await client.receive()
            assert held.cancelled_caught, "a black-holed route forwarded data"
            route.resume()
            with anyio.fail_after(5):
                assert await client.receive() == b"b"
        tg.cancel_scope.cancel()


@pytest.mark.redis
@pytest.mark.cluster
@pytest.mark.slow
def test_bounded_cluster_soak_with_kills(cluster_url: str) -> None:
    """About 60 s on the suite's Redis Cluster (3 masters): SIGKILLs of owners every 2.5 s
    (the cluster's nodes are shared with other tests, so none is restarted here; the failover
    tests kill masters); nothing lost, no overlap, no token back."""
    code, result, stderr = _soak(
        "--backend", "cluster", "--redis-url", cluster_url, "--seconds", "60", "--workers", "3",
        "--threads", "12", "--kill-every", "2.5", "--ttl-ms", "2000", "--rate", "25",
        "--seed", "11", timeout=400,
    )
    assert result["faults"]["kills"] >= 20
    assert result["signals"]["checked"] > 500
    _assert_passed(code, result, stderr)
