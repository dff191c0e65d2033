"""HTTP for every runtime call: ``create_app(runtime)`` is a Starlette (ASGI) app.

Needs the ``http`` extra (``pip install 'signal-leases[http]'``); see :mod:`signals.http._app`
for the routes and ``docs/http.md`` for the whole surface.
"""

from signals.http._app import (
    DEFAULT_HEARTBEAT,
    DEFAULT_MAX_WAIT,
    Action,
    Authorize,
    SignalsApp,
    create_app,
)

__all__ = [
    "DEFAULT_HEARTBEAT", "DEFAULT_MAX_WAIT", "Action", "Authorize", "SignalsApp", "create_app",
]
