"""Run ``python -m signals`` in a subprocess, as a user would (the checkout on PYTHONPATH, no
``$REDIS_URL`` from the test's environment)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["ROOT", "cli"]

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("REDIS_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "signals", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=ROOT,
    )
