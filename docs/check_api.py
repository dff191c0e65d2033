"""Check that docs/api.md mentions every public name and every log event of the library.

Run ``python docs/check_api.py`` (exit 1 and a list of what is missing); ``tests/test_docs.py``
runs the same checks. A name counts as documented when it appears in backticks, e.g. ```Signal```
or ```Signal(...)```; a log event when it appears in backticks anywhere in the file.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
API_MD = ROOT / "docs" / "api.md"
PACKAGES = ("leases", "pubsub", "signals")
TESTING_MODULES = ("leases.testing", "pubsub.testing", "signals.testing")
_LOG_CALL = re.compile(
    r"\.(?:debug|info|warning|warn|error|exception|critical|msg)\(\s*\"([a-z][a-z0-9_]*\.[a-z0-9_.]+)\""
)


def public_names() -> dict[str, list[str]]:
    """``{module: __all__}`` for the three packages and their ``testing`` modules (if present)."""
    names: dict[str, list[str]] = {}
    for mod in PACKAGES + TESTING_MODULES:
        try:
            module = importlib.import_module(mod)
        except ImportError:
            if mod in PACKAGES:
                raise
            continue
        names[mod] = list(getattr(module, "__all__", []))
    return names


def log_events() -> dict[str, list[str]]:
    """``{event name: [files]}`` for every structlog call with a literal namespaced event."""
    found: dict[str, list[str]] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).glob("*.py")):
            for event in _LOG_CALL.findall(path.read_text()):
                found.setdefault(event, []).append(str(path.relative_to(ROOT)))
    return found


def _documented(text: str, name: str) -> bool:
    return re.search(rf"`{re.escape(name)}(?:[`(\[.:]| )", text) is not None


def missing_names(text: str | None = None) -> list[str]:
    """``module.name`` for each public name that docs/api.md does not mention."""
    text = API_MD.read_text() if text is None else text
    return [
        f"{mod}.{name}"
        for mod, names in public_names().items()
        for name in names
        if not _documented(text, name) and not _documented(text, f"{mod}.{name}")
    ]


def missing_events(text: str | None = None) -> list[str]:
    """Log events emitted by the code that docs/api.md does not mention."""
    text = API_MD.read_text() if text is None else text
    return sorted(e for e in log_events() if f"`{e}`" not in text)


def main() -> int:
    names, events = missing_names(), missing_events()
    for n in names:
        print(f"docs/api.md does not mention public name {n}")
    for e in events:
        print(f"docs/api.md does not mention log event {e}")
    return 1 if names or events else 0


if __name__ == "__main__":
    raise SystemExit(main())
