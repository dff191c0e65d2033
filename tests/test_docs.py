"""The API reference names every public name and every log event (see docs/check_api.py)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def _checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_api", ROOT / "docs" / "check_api.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_api_md_mentions_every_public_name() -> None:
    missing = _checker().missing_names()
    assert not missing, f"add these to docs/api.md: {missing}"


def test_api_md_mentions_every_log_event() -> None:
    checker = _checker()
    assert checker.log_events(), "no log event found in the code: the checker's regex is broken"
    missing = checker.missing_events()
    assert not missing, f"add these log events to docs/api.md: {missing}"


def test_checker_detects_a_missing_name() -> None:
    assert _checker().missing_names("nothing documented here")


def test_docs_links_point_to_existing_files() -> None:
    for page in sorted((ROOT / "docs").glob("*.md")):
        for target in re.findall(r"\]\(([^)#:]+\.md)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).is_file(), f"{page.name} links to missing {target}"


def test_api_md_log_table_is_current() -> None:
    checker = _checker()
    assert checker.log_table_in_docs() == checker.log_table(), (
        "docs/api.md's log table is stale: run `python docs/check_api.py --write`"
    )
