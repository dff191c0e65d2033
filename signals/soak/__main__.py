"""``python -m signals.soak``: see :mod:`signals.soak`."""

from signals.soak import main

if __name__ == "__main__":
    raise SystemExit(main())
