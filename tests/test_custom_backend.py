"""The user-written backends pass the conformance kits: examples/custom_backend.py (one
process: the pub/sub and lease kits) and examples/sql_backend.py (across processes, from the
backend kit's public parts: the pub/sub, lease and every signal-core kit)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import leases
import pubsub
from leases import LeaseProvider
from leases.testing import LeaseProviderConformance
from pubsub import PubSub
from pubsub.testing import PubSubConformance

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

from custom_backend import LogBackend  # noqa: E402
from sql_backend import MyPubSub  # noqa: E402

from signals.kit import SQLCore  # noqa: E402
from signals.testing import SignalBackendConformance  # noqa: E402

pytestmark = pytest.mark.anyio


class TestCustomPubSub(PubSubConformance):
    max_delivery_attempts = 3

    @pytest.fixture
    async def pubsub(self) -> AsyncIterator[LogBackend]:
        async with LogBackend(max_delivery_attempts=self.max_delivery_attempts) as backend:
            yield backend


class TestCustomLeases(LeaseProviderConformance):
    @pytest.fixture
    def provider(self) -> LeaseProvider:
        return LogBackend()


def test_detected_structurally() -> None:
    backend = LogBackend()
    typed: PubSub = backend  # mypy checks the class against the protocol
    assert pubsub.is_pubsub(typed)
    assert leases.is_lease_provider(backend)
    assert leases.resolve_lease_provider(backend) is backend


@pytest.mark.anyio
async def test_the_base_class_validates_and_shares_extensions() -> None:
    async with LogBackend() as backend:
        with pytest.raises(TypeError, match="handler"):
            await backend.subscribe("t", "not callable")  # type: ignore[arg-type]
        store = backend.extension("store", lambda: {"built": 1})
        assert backend.extension("store", lambda: {"built": 2}) is store
        assert store == {"built": 1}


def test_demo_runs() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "custom_backend.py")],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    assert "is a lease provider: True" in out
    assert "send 'hello' -> wake" in out


class TestSQLBackendPubSub(PubSubConformance):
    max_delivery_attempts = 3

    @pytest.fixture
    async def pubsub(self, tmp_path: Path) -> AsyncIterator[MyPubSub]:
        async with MyPubSub(str(tmp_path / "b.db"),
                            max_delivery_attempts=self.max_delivery_attempts) as backend:
            yield backend


class TestSQLBackendLeases(LeaseProviderConformance):
    @pytest.fixture
    async def provider(self, tmp_path: Path) -> AsyncIterator[MyPubSub]:
        async with MyPubSub(str(tmp_path / "b.db")) as backend:
            yield backend  # the pub/sub is its own lease provider


class TestSQLBackendCore(SignalBackendConformance):
    @pytest.fixture
    async def pubsub(self, tmp_path: Path) -> AsyncIterator[MyPubSub]:
        async with MyPubSub(str(tmp_path / "b.db")) as backend:
            yield backend

    @pytest.fixture
    def leases(self, pubsub: MyPubSub) -> LeaseProvider:
        return pubsub.get_lease_provider()

    @pytest.fixture
    def core(self, pubsub: MyPubSub, leases: LeaseProvider) -> SQLCore:
        return SQLCore(pubsub.sql_database, leases=leases, pubsub=pubsub)


def test_sql_backend_demo_runs_across_processes() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "sql_backend.py")],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    assert [line.split(":")[0] for line in out.splitlines()] == [
        "thread-0", "thread-1", "thread-2", "thread-3"]
    assert "'echo': 'hello 3'" in out
