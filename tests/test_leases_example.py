"""examples/lease_keeper.py runs (in memory) and shows the fenced, cancelled zombie."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "lease_keeper.py"


def test_lease_keeper_example_runs_in_memory() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "lost=True, reason='renew rejected'" in done.stdout
    assert "REFUSED 'b late write'" in done.stdout
