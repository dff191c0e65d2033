"""``python -m signals``: the same as the ``signals`` command (see :mod:`signals.cli`)."""

from signals.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
