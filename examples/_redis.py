"""A tiny local ``redis-server`` launcher for the examples and benchmarks (no persistence).

Examples must not import from ``tests/``; this is the few lines they need.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

__all__ = ["local_redis", "on_redis", "redis_server_available"]


def redis_server_available() -> bool:
    """True when ``redis-server`` is on ``PATH``."""
    return shutil.which("redis-server") is not None


def on_redis(url: str | None, run: Callable[[str], int]) -> int:
    """``run(url)``; without ``url``, on a local ``redis-server`` started for it (exit status 2
    and a message saying what to install when there is none)."""
    if url:
        return run(url)
    if not redis_server_available():
        print("error: no --redis-url given and redis-server is not on PATH "
              "(apt-get install -y redis-server, or pass --redis-url redis://HOST:PORT/0)",
              file=sys.stderr)
        return 2
    with local_redis() as local:
        print(f"(started a local redis-server at {local})", flush=True)
        return run(local)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@contextmanager
def local_redis(timeout: float = 10.0) -> Iterator[str]:
    """Start ``redis-server`` on a free loopback port; yield its URL; stop it on exit."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not on PATH (apt-get install -y redis-server)")
    port = _free_port()
    workdir = tempfile.mkdtemp(prefix="signals-example-redis-")
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", workdir, "--protected-mode", "no", "--loglevel", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=workdir,
        start_new_session=True,  # Ctrl-C stops the example, which then stops this server
    )
    try:
        deadline = time.monotonic() + timeout
        while not _ping(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {port}")
            time.sleep(0.02)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        shutil.rmtree(workdir, ignore_errors=True)
