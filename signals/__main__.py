"""``python -m signals``: see :mod:`signals._cli`."""

from ._cli import main

if __name__ == "__main__":
    raise SystemExit(main())
