"""``python -m signals.soak``: a fault soak of the signal runtime, with a verdict.

The command line and the run are in :mod:`signals.soak._main`; the parts of a soak each have a
module here: ``options`` (backends and settings), ``fleet`` (worker processes), ``worker``
(one worker: ``python -m signals.soak.worker CONFIG``), ``sender``, ``proxy`` (black holes),
``redis_server`` (the soak's own Redis), ``record`` (what the agents saw) and ``verify`` (the
verdict).
"""

from signals.soak._main import (
    FactoryContext,
    Interrupted,
    SoakBackend,
    build_parser,
    main,
    run_soak,
)

__all__ = ["FactoryContext", "Interrupted", "SoakBackend", "build_parser", "main", "run_soak"]
