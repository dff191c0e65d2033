"""Every Python code block in README.md and docs/*.md runs as written.

Each ```` ```python ```` block is run as a script in a subprocess (from a scratch directory,
with the checkout on ``PYTHONPATH``). A block that is only a fragment (it continues an earlier
one, or shows a signature) is marked by an HTML comment on the line just above it::

    <!-- fragment -->

and is only compiled, not run. Blocks that talk to Redis name ``redis://127.0.0.1:6379/0``;
the test swaps in the URL of the suite's own redis-server.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests._redis_server import RedisServer

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DEFAULT_URL = "redis://127.0.0.1:6379/0"
_BLOCK = re.compile(r"(?P<before>[^\n]*)\n```python\n(?P<code>.*?)\n```", re.S)


def blocks() -> list[tuple[str, str, bool]]:
    """``(id, code, is_fragment)`` for every Python block of every page."""
    found = []
    for page in PAGES:
        text = "\n" + page.read_text()
        for n, match in enumerate(_BLOCK.finditer(text), start=1):
            fragment = "<!-- fragment -->" in match.group("before")
            line = text[: match.start("code")].count("\n")
            found.append((f"{page.name}:{line}#{n}", match.group("code"), fragment))
    return found


BLOCKS = blocks()


def test_there_are_blocks_to_check() -> None:
    assert len(BLOCKS) >= 5
    assert sum(not fragment for _, _, fragment in BLOCKS) >= 3, "most blocks must run"


@pytest.mark.parametrize(("where", "code", "fragment"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_block_runs_as_written(
    where: str, code: str, fragment: bool, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    compile(code, where, "exec")  # every block is at least valid Python
    if fragment:
        return
    if DEFAULT_URL in code:
        server: RedisServer = request.getfixturevalue("redis_server")
        code = code.replace(DEFAULT_URL, server.url)
    script = tmp_path / "block.py"
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120,
        cwd=tmp_path, env=env,
    )
    assert result.returncode == 0, f"{where} failed:\n{result.stderr[-3000:]}"
