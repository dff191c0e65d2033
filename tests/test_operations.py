"""Operations (docs/operations.md): a trace that crosses processes through the inbox, the
messaging metrics, and the HTTP app's OpenAPI document under schemathesis.

OpenTelemetry's providers are process-global, so every check that configures the SDK runs in
a subprocess of its own (nothing leaks into the rest of the suite).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent

SDK = textwrap.dedent("""
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))

    def spans():
        return [{"name": s.name, "kind": s.kind.name, "trace": format(s.context.trace_id, "032x"),
                 "span": format(s.context.span_id, "016x"),
                 "parent": format(s.parent.span_id, "016x") if s.parent else None,
                 "links": [format(l.context.trace_id, "032x") for l in s.links],
                 "attrs": {k: v for k, v in (s.attributes or {}).items()}}
                for s in exporter.get_finished_spans()]

    def metric_values():
        found = {}
        data = reader.get_metrics_data()
        for rm in (data.resource_metrics if data is not None else []):
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    for p in m.data.data_points:
                        value = getattr(p, "value", None)
                        found[m.name] = found.get(m.name, 0) + (
                            value if value is not None else p.count)
        return found
""")


def run_script(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


def test_spans_and_metrics_in_one_process() -> None:
    code = SDK + textwrap.dedent("""
        import json, anyio
        from pubsub import InMemoryPubSub
        from signals import Run, Signal, SignalRuntime

        def fold(signals):
            return [s.payload for s in signals]

        async def agent(run: Run) -> None:
            async for s in run:
                with trace.get_tracer("agent").start_as_current_span("agent work"):
                    await run.ack(s)

        async def main():
            async with InMemoryPubSub() as ps, SignalRuntime(
                    pubsub=ps, agent=agent, reducers={"k": fold}) as rt:
                with trace.get_tracer("app").start_as_current_span("request") as span:
                    tid = format(span.get_span_context().trace_id, "032x")
                    for i in range(5):
                        await rt.send("t", Signal({"i": i}, id=f"s{i}"))
                await rt.wait_idle()
                await rt.pause("f")
                for i in range(2):  # two sends from two traces, folded into one hand-out
                    with trace.get_tracer("app").start_as_current_span(f"typing {i}"):
                        await rt.send("f", Signal(i, id=f"k{i}", lane="k", merge="coalesce"))
                await rt.resume("f")
                await rt.wait_idle()
            print(json.dumps({"trace": tid, "spans": spans(), "metrics": metric_values()}))
        anyio.run(main)
    """)
    result = run_script(code)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    spans, tid = out["spans"], out["trace"]
    sends = {s["attrs"]["messaging.message.id"]: s for s in spans
             if s["name"] == "send signals.thread"}
    processes = {s["attrs"]["messaging.message.id"]: s for s in spans
                 if s["name"] == "process signals.thread"}
    for i in range(5):
        send, process = sends[f"s{i}"], processes[f"s{i}"]
        assert send["kind"] == "PRODUCER" and process["kind"] == "CONSUMER"
        assert send["trace"] == process["trace"] == tid
        assert process["parent"] == send["span"]  # a child of the sender's span
        attrs = process["attrs"]
        assert attrs["messaging.system"] == "signals"
        assert attrs["messaging.operation.type"] == "process"
        assert attrs["messaging.destination.name"] == "signals.thread"  # a template
        assert attrs["messaging.message.conversation_id"] == "t"
        assert attrs["gen_ai.conversation.id"] == "t"
        agent = [s for s in spans if s["name"] == "agent work" and s["parent"] == process["span"]]
        assert len(agent) == 1  # the agent's own span nests under the process span
    folded = processes["k1"]
    k_traces = {sends["k0"]["trace"], sends["k1"]["trace"]}
    assert set(folded["links"]) == k_traces and len(k_traces) == 2  # linked to both senders
    metrics = out["metrics"]
    assert metrics["messaging.client.sent.messages"] == 7
    assert metrics["messaging.client.consumed.messages"] == 7  # the folded one counts two
    assert metrics["messaging.process.duration"] == 6  # hand-outs
    assert metrics["messaging.client.operation.duration"] == 7


@pytest.mark.redis
def test_a_sender_with_no_runtime_starts_the_trace_a_worker_continues(
        redis_url: str, key_prefix: str) -> None:
    """``RedisSignalSender.send`` is a PRODUCER span, as a runtime's, and the worker's
    CONSUMER span is its child; the sender counts its message and a duplicate."""
    code = SDK + textwrap.dedent("""
        import json, sys, anyio
        from pubsub import RedisStreamsPubSub
        from signals import RedisSignalSender, Run, Signal, SignalRuntime
        done = anyio.Event()

        async def agent(run: Run) -> None:
            async for s in run:
                await run.ack(s)
                done.set()

        async def main():
            async with RedisStreamsPubSub(url=sys.argv[1], key_prefix=sys.argv[2]) as ps, \
                    SignalRuntime(pubsub=ps, agent=agent), \
                    RedisSignalSender(url=sys.argv[1], key_prefix=sys.argv[2]) as sender:
                with trace.get_tracer("app").start_as_current_span("webhook") as span:
                    tid = format(span.get_span_context().trace_id, "032x")
                    await sender.send("t", Signal(1, id="s1"))
                    await sender.send("t", Signal(1, id="s1"))  # a duplicate
                with anyio.fail_after(10):
                    await done.wait()
            print(json.dumps({"trace": tid, "spans": spans(), "metrics": metric_values()}))
        anyio.run(main)
    """)
    result = run_script(code, redis_url, key_prefix)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    sends = [s for s in out["spans"] if s["name"] == "send signals.thread"]
    [process] = [s for s in out["spans"] if s["name"] == "process signals.thread"]
    assert [s["kind"] for s in sends] == ["PRODUCER", "PRODUCER"]
    assert {s["trace"] for s in sends} == {process["trace"]} == {out["trace"]}
    assert process["parent"] == sends[0]["span"]
    assert out["metrics"]["messaging.client.sent.messages"] == 1
    assert out["metrics"]["signals.duplicates"] == 1


@pytest.mark.parametrize("backend", ["memory", pytest.param("redis", marks=pytest.mark.redis)])
def test_runtime_metrics_count_runs_leases_dead_letters_duplicates_and_takeovers(
        backend: str, request: pytest.FixtureRequest) -> None:
    args = ([request.getfixturevalue("redis_url"), request.getfixturevalue("key_prefix")]
            if backend == "redis" else [])
    code = SDK + textwrap.dedent("""
        import json, sys, time, anyio
        from pubsub import InMemoryPubSub, RedisStreamsPubSub
        from signals import Run, Signal, SignalRuntime
        hung, go, retaken = anyio.Event(), anyio.Event(), anyio.Event()
        acked = set()
        snapshots = {}

        async def agent(run: Run) -> None:
            if run.thread_key == "d":
                await run.next_signal()
                raise RuntimeError("boom")  # every hand-out fails: dead-lettered at 2
            if not hung.is_set():
                await run.next_signal()  # takes all three: one handed out, two waiting
                hung.set()
                await go.wait()
                time.sleep(1.0)  # blocks the loop past the TTL: the session and lease expire
                await anyio.sleep_forever()  # until the heartbeat finds the lease lost
            async for s in run:
                await run.ack(s)
                acked.add(s.id)
                if len(acked) == 3:
                    retaken.set()

        async def main():
            ps = (RedisStreamsPubSub(url=sys.argv[1], key_prefix=sys.argv[2])
                  if len(sys.argv) > 1 else InMemoryPubSub())
            async with ps, SignalRuntime(
                    pubsub=ps, agent=agent, lease_ttl_ms=600, max_attempts=2) as rt:
                await rt.pause("t")
                for i in range(3):
                    await rt.send("t", Signal(i, id=f"s{i}"))
                await rt.send("t", Signal(0, id="s0"))  # a duplicate
                await rt.resume("t")
                await hung.wait()
                snapshots["hung"] = metric_values()
                go.set()
                with anyio.fail_after(10):
                    await retaken.wait()  # taken back by recovery, all three acknowledged
                await rt.send("d", Signal("x", id="dead"))
                with anyio.fail_after(10):
                    while metric_values().get("signals.dead_letters", 0) < 1:
                        await anyio.sleep(0.02)
                await rt.wait_idle()
                snapshots["end"] = metric_values()
            print(json.dumps(snapshots))
        anyio.run(main)
    """)
    result = run_script(code, *args)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    hung, end = out["hung"], out["end"]
    assert hung["signals.runs.active"] == 1
    assert hung["signals.pending"] == 3  # one handed out and two waiting, none acknowledged
    assert hung["signals.duplicates"] == 1
    assert end["signals.runs.active"] == 0
    assert end["signals.pending"] == 0
    assert end["signals.leases.lost"] == 1
    assert end["signals.dead_letters"] == 1
    assert end["signals.takeover.duration"] == 1  # s0, handed out again after the loss
    assert end["signals.routing.duration"] == 4  # s0 once, s1, s2 and dead: first hand-outs


def test_without_an_sdk_nothing_is_emitted() -> None:
    code = textwrap.dedent("""
        import anyio
        from opentelemetry import trace
        from pubsub import InMemoryPubSub
        from signals import Run, Signal, SignalRuntime
        seen = []
        async def agent(run: Run) -> None:
            async for s in run:
                seen.append((s.trace_context, trace.get_current_span().is_recording()))
                await run.ack(s)
        async def main():
            async with InMemoryPubSub() as ps, SignalRuntime(pubsub=ps, agent=agent) as rt:
                await rt.send("t", Signal(1))
                await rt.wait_idle()
            print(seen)
        anyio.run(main)
    """)
    result = run_script(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[(None, False)]"  # no context stored, no span


@pytest.mark.redis
def test_the_trace_crosses_processes_through_the_inbox(redis_url: str, key_prefix: str,
                                                       tmp_path: Path) -> None:
    worker = SDK + textwrap.dedent("""
        import json, sys, anyio
        from pubsub import RedisStreamsPubSub
        from signals import Run, SignalRuntime
        async def agent(run: Run) -> None:
            async for s in run:
                with trace.get_tracer("agent").start_as_current_span("agent work"):
                    await run.ack(s)
        async def main():
            ps = RedisStreamsPubSub(url=sys.argv[1], key_prefix=sys.argv[2])
            async with ps, SignalRuntime(pubsub=ps, agent=agent) as rt:
                print("ready", flush=True)
                with anyio.fail_after(20):
                    while not any(s["name"] == "agent work" for s in spans()):
                        await anyio.sleep(0.05)
            print(json.dumps(spans()), flush=True)
        anyio.run(main)
    """)
    sender = SDK + textwrap.dedent("""
        import json, sys, anyio
        from pubsub import RedisStreamsPubSub
        from signals import Signal, SignalRuntime
        async def main():
            ps = RedisStreamsPubSub(url=sys.argv[1], key_prefix=sys.argv[2])
            async with ps, SignalRuntime(pubsub=ps, agent=None) as rt:
                with trace.get_tracer("app").start_as_current_span("user request") as span:
                    await rt.send("traced", Signal({"q": 1}, id="sig-1"))
                    print(format(span.get_span_context().trace_id, "032x"))
        anyio.run(main)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", worker, redis_url, key_prefix], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        sent = run_script(sender, redis_url, key_prefix)
        assert sent.returncode == 0, sent.stderr
        trace_id = sent.stdout.strip()
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    spans = json.loads(out.strip().splitlines()[-1])
    [process] = [s for s in spans if s["name"] == "process signals.thread"]
    assert process["trace"] == trace_id  # the sender's trace, in another process
    assert process["attrs"]["messaging.message.id"] == "sig-1"
    assert process["attrs"]["messaging.message.conversation_id"] == "traced"
    [agent] = [s for s in spans if s["name"] == "agent work"]
    assert agent["trace"] == trace_id and agent["parent"] == process["span"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.redis
def test_the_openapi_document_holds_under_schemathesis(redis_url: str, key_prefix: str,
                                                       tmp_path: Path) -> None:
    app = textwrap.dedent("""
        import contextlib, sys, uvicorn
        from pubsub import RedisStreamsPubSub
        from signals import Run, SignalRuntime
        from signals.http import create_app
        async def agent(run: Run) -> None:
            async for s in run:
                await run.ack(s, result={"ok": True})
        ps = RedisStreamsPubSub(url=sys.argv[1], key_prefix=sys.argv[2])
        runtime = SignalRuntime(pubsub=ps, agent=agent)
        inner = create_app(runtime)
        async def app(scope, receive, send):
            if scope["type"] == "lifespan":
                await receive()
                async with ps, runtime:
                    await send({"type": "lifespan.startup.complete"})
                    await receive()
                await send({"type": "lifespan.shutdown.complete"})
                return
            await inner(scope, receive, send)
        uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[3]), log_level="warning")
    """)
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen([sys.executable, "-c", app, redis_url, key_prefix, str(port)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, cwd=ROOT)
    url = f"http://127.0.0.1:{port}/openapi.json"
    try:
        import httpx

        document: dict[str, Any] = {}
        for _ in range(100):
            try:
                document = httpx.get(url, timeout=2).json()
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        assert {"/threads/{key}/signals", "/threads/{key}", "/threads/{key}/abort",
                "/threads/{key}/signals/{id}", "/threads/{key}/pause", "/schedules",
                "/schedules/{id}", "/threads/{key}/stream"} <= set(document.get("paths", {}))
        fuzz = subprocess.run(
            [sys.executable, "-m", "schemathesis.cli", "run", url, "-n", "25",
             "--request-timeout", "10", "--exclude-path-regex", "stream",
             "--checks", "not_a_server_error,response_schema_conformance"],
            capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
        assert fuzz.returncode == 0, fuzz.stdout[-3000:] + fuzz.stderr[-2000:]
    finally:
        server.terminate()
        _, err = server.communicate(timeout=30)
    assert "Traceback" not in err, err


def test_http_requests_carry_trace_context_in_and_out() -> None:
    code = SDK + textwrap.dedent("""
        import json, anyio, httpx
        from pubsub import InMemoryPubSub
        from signals import Run, SignalRuntime
        from signals.http import create_app
        TRACE = "0af7651916cd43dd8448eb211c80319c"
        async def agent(run: Run) -> None:
            async for s in run:
                await run.ack(s)
        async def main():
            async with InMemoryPubSub() as ps, SignalRuntime(pubsub=ps, agent=agent) as rt:
                app = create_app(rt)
                async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                             base_url="http://127.0.0.1") as client:
                    parent = f"00-{TRACE}-b7ad6b7169203331-01"
                    r = await client.post("/threads/t/signals", json={"payload": 1, "id": "h1"},
                                          headers={"traceparent": parent})
                    await rt.wait_idle()
                    # The event stream (its own response class) carries it back too.
                    s = await client.get("/threads/t/stream?follow=false",
                                         headers={"traceparent": parent})
            print(json.dumps({"status": r.status_code, "out": r.headers.get("traceparent"),
                              "stream": [s.status_code, s.headers.get("traceparent")],
                              "spans": spans()}))
        anyio.run(main)
    """)
    result = run_script(code)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    assert out["status"] == 200 and out["out"].split("-")[1] == trace_id
    assert out["stream"][0] == 200 and out["stream"][1].split("-")[1] == trace_id
    by_name = {s["name"]: s for s in out["spans"]}
    server = by_name["POST /threads/{key}/signals"]
    assert server["kind"] == "SERVER" and server["trace"] == trace_id
    assert server["parent"] == "b7ad6b7169203331"  # the caller's span
    assert by_name["send signals.thread"]["parent"] == server["span"]
    assert by_name["process signals.thread"]["trace"] == trace_id
