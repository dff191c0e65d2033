"""The ``signals`` command (also ``python -m signals``): see and control threads from a shell.

The commands and their exit codes are in :mod:`signals.cli._main`; the text and JSON forms of
what they print in :mod:`signals.cli._format`.
"""

from signals.cli._main import DEFAULT_KEY_PREFIX, Prefixes, build_parser, main

__all__ = ["DEFAULT_KEY_PREFIX", "Prefixes", "build_parser", "main"]
