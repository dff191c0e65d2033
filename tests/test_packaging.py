"""Packaging promises: explicit ``__all__``, typed packages, README and CI agree."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

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
    """PyPubSub installs a top-level ``pubsub`` too: when it shadows ours, ``import signals``
    says so at once instead of failing later."""
    import os
    import subprocess
    import sys

    fake = tmp_path / "pubsub"
    fake.mkdir()
    (fake / "__init__.py").write_text("# PyPubSub's package, say\npub = object()\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    result = subprocess.run(
        [sys.executable, "-c", "import signals"], capture_output=True, text=True, env=env,
        cwd=tmp_path, timeout=60,
    )
    assert result.returncode != 0
    assert "ImportError" in result.stderr and "PyPubSub" in result.stderr, result.stderr
    assert "pip uninstall pypubsub" in result.stderr
