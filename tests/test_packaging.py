"""Packaging promises: explicit ``__all__``, typed packages, README and CI agree."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pubsub

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["leases", "pubsub", "signals"]


@pytest.mark.parametrize("name", PACKAGES)
def test_package_exports_exist_and_are_unique(name: str) -> None:
    module = importlib.import_module(name)
    exported = module.__all__
    assert exported, f"{name}.__all__ is empty"
    assert len(set(exported)) == len(exported)
    for attr in exported:
        assert hasattr(module, attr), f"{name}.{attr} is in __all__ but missing"


@pytest.mark.parametrize("name", PACKAGES)
def test_package_is_typed(name: str) -> None:
    assert (ROOT / name / "py.typed").is_file()


def test_ci_runs_exactly_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)\n```", readme, flags=re.S)
    test_commands = [b.strip() for b in blocks if "scripts/test" in b or "pytest" in b]
    assert len(test_commands) == 1, "README must show exactly one test command"
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_commands[0] in ci.splitlines()


def test_readme_example_command_names_an_existing_example() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)\n```", readme, flags=re.S)
    example = [b for b in blocks if "examples/" in b]
    assert example
    path = re.search(r"(examples/\S+\.py)", example[0])
    assert path and (ROOT / path.group(1)).is_file()


def test_a_foreign_pubsub_module_is_a_clear_import_error(tmp_path: Path) -> None:
    """PyPubSub installs a top-level ``pubsub`` too: when it shadows ours, the runtime's
    import says so at once instead of failing later. (``import signals`` alone loads the
    records only, for a sender with no runtime.)"""
    import os
    import subprocess
    import sys

    fake = tmp_path / "pubsub"
    fake.mkdir()
    (fake / "__init__.py").write_text("# PyPubSub's package, say\npub = object()\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    result = subprocess.run(
        [sys.executable, "-c", "from signals import SignalRuntime"], capture_output=True,
        text=True, env=env,
        cwd=tmp_path, timeout=60,
    )
    assert result.returncode != 0
    assert "ImportError" in result.stderr and "PyPubSub" in result.stderr, result.stderr
    assert "pip uninstall pypubsub" in result.stderr


def test_a_redis_sender_imports_no_other_backend() -> None:
    """The cold start of a serverless sender (docs/performance.md): ``import signals, pubsub``
    and the Redis pub/sub load neither SQLite, Postgres, the in-memory backends, structlog nor
    the time zones of schedules; each is imported on first use. (redis-py itself imports
    OpenTelemetry when installed.)"""
    code = (
        "import sys, signals, pubsub, leases; pubsub.RedisStreamsPubSub; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('sqlite3', 'psycopg', 'structlog', 'croniter', 'zoneinfo') or m.startswith(("
        "'pubsub._backends.memory', 'pubsub._backends.sql', 'pubsub._backends.postgres', "
        "'pubsub._backends.sqlite', 'leases._backends.memory', 'leases._backends.sql', "
        "'leases._backends.postgres', 'signals._backends.memory', 'signals.kit._sql', "
        "'_signal_leases.sql'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout.strip()
    assert out == "[]"
    for name in ("InMemoryPubSub", "SQLitePubSub", "PostgresPubSub", "SQLPubSub", "Doorbell"):
        assert name in dir(pubsub) and getattr(pubsub, name).__name__ == name
