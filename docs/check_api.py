"""Check that docs/api.md mentions every public name and every log event of the library.

Run ``python docs/check_api.py`` (exit 1 and a list of what is missing); ``tests/test_docs.py``
runs the same checks. ``python docs/check_api.py --log-table`` prints the Markdown table of log
events (name, logger, level, keys passed at the call) that docs/api.md carries between the
``log-table`` markers; ``--write`` regenerates that block in place.

A name counts as documented when it appears in backticks (```Signal``` or ```Signal(...)```);
a log event when it appears in backticks anywhere in the file.
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
API_MD = ROOT / "docs" / "api.md"
PACKAGES = ("leases", "pubsub", "signals")
TESTING_MODULES = ("leases.testing", "pubsub.testing", "signals.testing", "signals.kit")
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
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for event in _LOG_CALL.findall(path.read_text()):
                found.setdefault(event, []).append(str(path.relative_to(ROOT)))
    return found


def _call_args(text: str, start: int) -> str:
    """The argument text of the call whose ``(`` is at ``start``."""
    depth, i = 1, start + 1
    while depth and i < len(text):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        i += 1
    return text[start + 1 : i - 1]


_LOG_CALL_FULL = re.compile(
    r"\.(debug|info|warning|warn|error|exception|critical)(\()\s*\"([a-z][a-z0-9_]*\.[a-z0-9_.]+)\""
)


def log_table() -> str:
    """Markdown rows: event, logger (package), levels, keyword fields passed at the call sites."""
    rows: dict[str, tuple[set[str], set[str], list[str]]] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            text = path.read_text()
            for m in _LOG_CALL_FULL.finditer(text):
                level, event = m.group(1), m.group(3)
                args = _call_args(text, m.start(2))
                loggers, levels, keys = rows.setdefault(event, (set(), set(), []))
                loggers.add(pkg)
                levels.add(level)
                for key in re.findall(r"\b(\w+)=", args):
                    if key not in keys:
                        keys.append(key)
    lines = ["| Event | Logger | Level | Fields at the call |", "|---|---|---|---|"]
    for event in sorted(rows):
        loggers, levels, keys = rows[event]
        fields = ", ".join(keys) or "-"
        lines.append(
            f"| `{event}` | {', '.join(sorted(loggers))} | {', '.join(sorted(levels))} | {fields} |"
        )
    return "\n".join(lines)


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


START, END = "<!-- log-table:start -->", "<!-- log-table:end -->"


def log_table_in_docs(text: str | None = None) -> str:
    """The table between the markers in docs/api.md."""
    text = API_MD.read_text() if text is None else text
    return text.split(START, 1)[1].split(END, 1)[0].strip()


def write_log_table() -> None:
    text = API_MD.read_text()
    head, rest = text.split(START, 1)
    tail = rest.split(END, 1)[1]
    API_MD.write_text(f"{head}{START}\n{log_table()}\n{END}{tail}")


def main() -> int:
    if "--log-table" in sys.argv[1:]:
        print(log_table())
        return 0
    if "--write" in sys.argv[1:]:
        write_log_table()
    names, events = missing_names(), missing_events()
    for n in names:
        print(f"docs/api.md does not mention public name {n}")
    for e in events:
        print(f"docs/api.md does not mention log event {e}")
    return 1 if names or events else 0


if __name__ == "__main__":
    raise SystemExit(main())
