"""A serverless invocation: a fresh process imports, sends one signal, and exits.

Side by side in one run, interleaved, each a fresh ``python`` process against the same
``redis-server``:

* ``raw``: ``import redis.asyncio``, one ``XADD`` and one ``PUBLISH``, close;
* ``signals``: ``import signals, pubsub``, ``SignalRuntime(pubsub=RedisStreamsPubSub(...),
  agent=None)``, one ``send`` (stored durably, routed, receipt), close;
* ``sender``: ``from signals import RedisSignalSender``, one ``send`` (the same script call
  as the sender-only runtime's), close, on ``asyncio.run``.

Also the import time alone (``python -X importtime``, the top-level modules' cumulative time).

The checkout's modules are byte-compiled first, as ``pip install`` does: with
``PYTHONDONTWRITEBYTECODE`` set (some CI images and sandboxes set it), a module edited since
its ``.pyc`` was written is compiled again in every fresh process (eight stale modules cost
16-18 ms of ``compile`` in one profile here).

    python bench/coldstart.py [--rounds 15] [--redis-url URL] [--python PATH] [--instructions]

``--python``: the interpreter of the fresh processes (default: this one). The figure that a
user of a plain ``pip install .`` gets needs an environment without the test extras:
redis-py imports the OpenTelemetry SDK when it is installed (its metrics recorder), which
makes the raw side slower (about 80 ms here) and the ratio look better than it is. Make one
with ``python -m venv /tmp/plain && /tmp/plain/bin/pip install .`` and pass
``--python /tmp/plain/bin/python``; the checkout is imported either way.

``--instructions``: instead of timing, count the instructions of one fresh process of each
kind (and of ``raw`` with ``anyio.run``: what any anyio library pays) under ``valgrind
--tool=callgrind``, which must be installed. On a shared machine wall time moves by a third
from run to run; the counts agree within 0.1 %.

Goal (issue "Performance"): ``signals`` <= 1.3x ``raw``; the ``sender`` is the path for a
process that only sends.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
sys.path[0] = str(ROOT)  # the checkout, not bench/ (bench/signals.py)

from bench._server import redis_url  # noqa: E402

RAW = """
import sys, asyncio
import redis.asyncio as redis

async def main():
    client = redis.Redis.from_url(sys.argv[1])
    await client.xadd("cold:raw", {"payload": '{"n": 1}'})
    await client.publish("cold:raw:notice", "1")
    await client.aclose()

asyncio.run(main())
"""

SIGNALS = """
import sys, anyio
from pubsub import RedisStreamsPubSub
from signals import SignalRuntime

async def main():
    async with RedisStreamsPubSub(url=sys.argv[1], key_prefix="cold:") as ps, SignalRuntime(
            pubsub=ps, agent=None) as rt:
        await rt.send("cold", {"n": 1})

anyio.run(main)
"""

SENDER = """
import sys, asyncio
from signals import RedisSignalSender

async def main():
    async with RedisSignalSender(url=sys.argv[1], key_prefix="cold:") as sender:
        await sender.send("cold", {"n": 1})

asyncio.run(main())
"""

RAW_ANYIO = RAW.replace("import sys, asyncio", "import sys, asyncio, anyio").replace(
    "asyncio.run(main())", "anyio.run(main)")

CODE = {"raw": RAW, "signals": SIGNALS, "sender": SENDER}
IMPORTS = {"raw": "import redis.asyncio", "signals": "import signals, pubsub; "
           "pubsub.RedisStreamsPubSub", "sender": "import redis.asyncio, signals; "
           "signals.RedisSignalSender"}


def _fresh(python: str, *args: str, capture: bool = False,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python *args`` in a fresh process, from ``/``, with the checkout on its path."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([python, *args], check=True, env=env, cwd="/",
                          capture_output=capture, text=True)


def once(python: str, code: str, url: str) -> float:
    start = time.perf_counter()
    _fresh(python, "-c", code, url)
    return time.perf_counter() - start


def import_ms(python: str, code: str) -> float:
    out = _fresh(python, "-X", "importtime", "-c", code, capture=True).stderr
    total = 0
    for line in out.splitlines():
        parts = line.split("|")
        if (len(parts) == 3 and parts[1].strip().isdigit() and parts[2].startswith(" ")
                and not parts[2].startswith("  ")):
            total += int(parts[1])  # a top-level import: its cumulative microseconds
    return total / 1000


def instructions(python: str, code: str, url: str) -> int:
    """Instructions of one fresh process running ``code``, counted by callgrind (with a fixed
    hash seed: set and dict layouts, and so the work, are the same in every run)."""
    out = _fresh("valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", python,
                 "-c", code, url, capture=True, env={"PYTHONHASHSEED": "0"}).stderr
    refs = [line for line in out.splitlines() if "refs:" in line]
    if not refs:
        raise SystemExit(f"no instruction count in valgrind's output:\n{out}")
    return int(refs[-1].split()[-1].replace(",", ""))


def count(python: str, url: str, otel: bool) -> None:
    for code in CODE.values():
        once(python, code, url)  # warm the file cache
    counts = {name: instructions(python, code, url) for name, code in
              (("raw", RAW), ("raw + anyio", RAW_ANYIO), ("signals", SIGNALS),
               ("sender", SENDER))}
    print(f"instructions of one fresh process ({python}; the OpenTelemetry SDK "
          f"{'is' if otel else 'is not'} installed there):")
    for name, n in counts.items():
        print(f"  {name:12s} {n / 1e6:7.1f} M  x{n / counts['raw']:.2f} of raw")
    print("goal: signals (or sender) <= 1.3x raw")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter of the fresh processes (see the module docstring)")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions under valgrind instead of timing")
    args = parser.parse_args()
    python = args.python
    otel = subprocess.run([python, "-c", "import opentelemetry.sdk"], capture_output=True)
    packages = [str(ROOT / p) for p in ("_signal_leases", "leases", "pubsub", "signals")]
    subprocess.run([python, "-m", "compileall", "-q", *packages], check=True)  # as installed
    if args.instructions:
        if shutil.which("valgrind") is None:
            raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
        with redis_url(args.redis_url) as url:
            count(python, url, otel.returncode == 0)
        return
    times: dict[str, list[float]] = {name: [] for name in CODE}
    imports: dict[str, list[float]] = {name: [] for name in CODE}
    with redis_url(args.redis_url) as url:
        for code in CODE.values():
            once(python, code, url)  # warm the file cache
        for r in range(args.rounds):
            order = list(CODE)[r % 3:] + list(CODE)[:r % 3]  # each kind first in turn
            for name in order:
                times[name].append(once(python, CODE[name], url))
                imports[name].append(import_ms(python, IMPORTS[name]))
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    imp = {k: statistics.median(v) for k, v in imports.items()}
    print(f"a fresh process sends one signal, median of {args.rounds} ({python}; the "
          f"OpenTelemetry SDK {'is' if otel.returncode == 0 else 'is not'} installed there):")
    print(f"  raw      {med['raw']:6.1f} ms  (imports {imp['raw']:5.1f} ms)")
    for name in ("signals", "sender"):
        print(f"  {name:8s} {med[name]:6.1f} ms  (imports {imp[name]:5.1f} ms)  "
              f"x{med[name] / med['raw']:.2f} of raw")
    print("goal: <= 1.3x")


if __name__ == "__main__":
    main()
