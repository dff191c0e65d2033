"""Who may call :mod:`signals.http`: the ``authorize`` hook, or the loopback-only default.

With a hook, the hook alone decides: ``True`` allows, anything else is 403 ``forbidden``, a
``PermissionError`` is 401 ``unauthorized`` (missing or invalid credentials).

Without a hook (and without ``allow_remote=True``) the app serves this machine only, checked
three ways so that neither a remote client nor a web page from another site gets in:

* the client address is a loopback address (behind a reverse proxy on this host, that is the
  proxy's unless it forwards the client's address and the server trusts it: uvicorn does for
  ``X-Forwarded-For`` from 127.0.0.1 by default);
* the ``Host`` header names a loopback host (``localhost``, ``127.x.x.x``, ``::1``), which
  stops DNS rebinding (a foreign name made to resolve to 127.0.0.1);
* an ``Origin`` header, when present, is this server's own origin, which stops a page from
  another site posting to the local server (a browser sends ``Origin`` on those requests).
"""

from __future__ import annotations

import inspect
import ipaddress
from collections.abc import Awaitable, Callable
from typing import Literal, TypeAlias
from urllib.parse import urlsplit

from starlette.requests import Request

from signals.http._common import HTTPError

__all__ = ["Action", "Authorize", "check_access", "is_loopback_host", "is_loopback_ip"]

Action: TypeAlias = Literal["send", "stream", "read", "abort", "cancel", "pause", "schedule"]
"""What a request does: ``send`` (POST a signal), ``stream`` (the SSE stream), ``read``
(thread, pending signals, receipts), ``abort`` (a run) or ``cancel`` (a queued signal)."""

Authorize: TypeAlias = Callable[[Request, str, Action], "bool | Awaitable[bool]"]
"""``authorize(request, thread_key, action)``: ``True`` to allow (sync or async)."""

_HINT = "pass authorize= (or allow_remote=True) to create_app to serve other clients"


def is_loopback_ip(host: str | None) -> bool:
    """True for a loopback IP address (IPv4-mapped IPv6 included); False for anything else,
    names and ``None`` (no address, as on a Unix socket) included."""
    if not host:
        return False
    try:
        address = ipaddress.ip_address(host.strip("[]").split("%")[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def is_loopback_host(host_header: str) -> bool:
    """True when a ``Host`` header value (``name[:port]``) names this machine."""
    value = host_header.strip().lower()
    if value.startswith("["):  # [::1]:8000
        name = value[1:value.find("]")] if "]" in value else value
    elif value.count(":") == 1:
        name = value.split(":")[0]
    else:
        name = value
    return name == "localhost" or name.endswith(".localhost") or is_loopback_ip(name)


def _local_only(request: Request) -> None:
    client = request.client.host if request.client is not None else None
    if not is_loopback_ip(client):
        raise HTTPError(403, "forbidden",
                        f"only loopback clients are served, not {client or 'an unknown address'}"
                        f" ({_HINT})")
    host = request.headers.get("host")
    if host is not None and not is_loopback_host(host):
        raise HTTPError(403, "forbidden", f"Host {host!r} is not a loopback name ({_HINT})")
    origin = request.headers.get("origin")
    if origin is not None:
        netloc = urlsplit(origin).netloc.lower() if origin != "null" else ""
        if host is None or netloc != host.strip().lower():
            raise HTTPError(403, "forbidden",
                            f"cross-origin request from {origin!r} refused ({_HINT})")


async def check_access(
    request: Request,
    thread_key: str,
    action: Action,
    authorize: Authorize | None,
    allow_remote: bool,
) -> None:
    """Raise :class:`HTTPError` (401 or 403) unless the request may do ``action``."""
    if authorize is None:
        if not allow_remote:
            _local_only(request)
        return
    try:
        verdict = authorize(request, thread_key, action)
        if inspect.isawaitable(verdict):
            verdict = await verdict
    except PermissionError as exc:
        raise HTTPError(401, "unauthorized", str(exc) or "authentication required") from None
    if verdict is not True:
        raise HTTPError(403, "forbidden", f"not allowed to {action} on this thread")
