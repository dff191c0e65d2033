"""HTTP for every runtime call: ``create_app(runtime)`` is a Starlette (ASGI) app.

Needs the ``http`` extra (``pip install 'signal-leases[http]'``). Routes (``{key}`` is the
thread key, ``{id}`` a signal id, each one percent-encoded path segment; see ``docs/http.md``):

=======  ==============================  ==========================================  =======
method   path                            runtime call                                action
=======  ==============================  ==========================================  =======
POST     ``/threads/{key}/signals``      ``send`` (``?wait=S``: and ``wait_for``)    send
GET      ``/threads/{key}/stream``       ``stream``, as Server-Sent Events           stream
GET      ``/threads/{key}``              ``thread`` and ``pending``                  read
POST     ``/threads/{key}/abort``        ``abort``                                   abort
POST     ``/threads/{key}/pause``        ``pause``                                   pause
POST     ``/threads/{key}/resume``       ``resume``                                  pause
DELETE   ``/threads/{key}/signals/{id}`` ``cancel``                                  cancel
GET      ``/threads/{key}/signals/{id}`` ``receipt`` (``?wait=S``: ``wait_for``)     read
GET      ``/openapi.json``               the OpenAPI document of these routes        (none)
GET      ``/schedules``                  ``schedules`` (those ``read`` allows)       read
POST     ``/schedules``                  ``schedule``                                schedule
DELETE   ``/schedules/{id}``             ``unschedule``                              schedule
=======  ==============================  ==========================================  =======

The runtime must be entered (``async with SignalRuntime(...)``) on the event loop that serves
the app, for as long as it serves; call ``app.close_streams()`` when the server starts shutting
down. Errors are JSON ``{"error": code, "message": ...}``.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_to_bytes

try:
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route
    from starlette.types import Receive, Scope, Send
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "signals.http needs Starlette: pip install 'signal-leases[http]'"
    ) from exc

from _signal_leases.validation import check_seconds
from signals._model import Signal
from signals._telemetry import Telemetry
from signals.http._auth import Action, Authorize, check_access
from signals.http._common import (
    HTTPError,
    delivery_json,
    error_response,
    query_bool,
    query_float,
    query_int,
    read_object,
    receipt_json,
    runtime_errors,
    schedule_json,
    signal_json,
    thread_json,
)
from signals.http._openapi import openapi
from signals.http._sse import EventStream, StreamRegistry

if TYPE_CHECKING:
    from signals._runtime import SignalRuntime

__all__ = [
    "DEFAULT_HEARTBEAT", "DEFAULT_MAX_WAIT", "Action", "Authorize", "SignalsApp", "create_app",
]

#: Seconds between two ``: keep-alive`` comments on an idle event stream.
DEFAULT_HEARTBEAT = 15.0
#: The largest ``?wait=`` a request may ask for, in seconds.
DEFAULT_MAX_WAIT = 300.0

_SIGNAL_FIELDS = ("id", "type", "priority", "lane", "merge", "cache_key", "not_before",
                  "expires_at", "debounce_ms", "max_wait_ms")
_SEND_OPTIONS = ("if_active", "if_idle", "delay_ms", "expires_in_ms")
_SEND_FIELDS = frozenset({"payload", *_SIGNAL_FIELDS, *_SEND_OPTIONS})
_ABORT_FIELDS = frozenset({"run_id", "clear_pending", "reason"})
_STORED = frozenset({"wake", "deliver", "queued"})

Handler = Callable[[Request, str, "str | None"], Awaitable[Any]]


_SCHEDULE_FIELDS = frozenset({"schedule_id", "thread_key", "signal", "every_ms", "cron", "tz",
                              "catch_up"})


class _Schedules:
    """``/schedules``: list, create (or update), delete; authorized per schedule's thread."""

    def __init__(self, api: _Api) -> None:
        self.api = api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            with runtime_errors():
                response = await self.handle(request)
        except HTTPError as exc:
            response = exc.response()
        await response(scope, receive, send)

    async def allowed(self, request: Request, key: str, action: Action) -> bool:
        try:
            await check_access(request, key, action, self.api.authorize, self.api.allow_remote)
        except HTTPError:
            return False
        return True

    async def handle(self, request: Request) -> Response:
        api, runtime = self.api, self.api.runtime
        if request.method == "GET":
            if api.authorize is None:  # this machine only (unless allow_remote): all of them
                await check_access(request, "", "read", None, api.allow_remote)
                found = await runtime.schedules()
            else:  # the schedules of the threads the caller may read
                found = [s for s in await runtime.schedules()
                         if await self.allowed(request, s.thread_key, "read")]
            return JSONResponse({"schedules": [schedule_json(s) for s in found]})
        if request.method == "POST":
            body = await read_object(request, _SCHEDULE_FIELDS, limit=api.body_limit)
            for name in ("schedule_id", "thread_key", "signal"):
                if name not in body:
                    raise HTTPError(400, "bad_request", f"the body needs {name}")
            spec = body["signal"]
            if not isinstance(spec, dict) or "payload" not in spec:
                raise HTTPError(400, "bad_request", "signal must be an object with a payload")
            unknown = sorted(set(spec) - {"payload", *_SIGNAL_FIELDS} - {"id"})
            if unknown or "id" in spec:
                raise HTTPError(400, "bad_request", "signal takes payload, type and the "
                                f"disposition fields (not {', '.join(unknown) or 'id'})")
            await check_access(request, body["thread_key"], "schedule", api.authorize,
                               api.allow_remote)
            signal = Signal(spec["payload"], **{k: v for k, v in spec.items() if k != "payload"})
            made = await runtime.schedule(
                body["schedule_id"], body["thread_key"], signal, every_ms=body.get("every_ms"),
                cron=body.get("cron"), tz=body.get("tz", "UTC"),
                catch_up=body.get("catch_up", "latest"))
            return JSONResponse(schedule_json(made))
        schedule_id = request.path_params["schedule_id"]
        known = {s.schedule_id: s for s in await runtime.schedules()}.get(schedule_id)
        if known is None:
            raise HTTPError(404, "unknown_schedule", f"no schedule {schedule_id!r}")
        await check_access(request, known.thread_key, "schedule", api.authorize,
                           api.allow_remote)
        await runtime.unschedule(schedule_id)
        return JSONResponse({"schedule_id": schedule_id, "removed": True})


async def _openapi_json(request: Request) -> Response:
    return JSONResponse(openapi())


class SignalsApp(Starlette):
    """The app :func:`create_app` returns: a Starlette app, plus :meth:`close_streams`."""

    def __init__(self, api: _Api) -> None:
        super().__init__(
            routes=[Route("/threads/{rest:path}", api),
                    Route("/schedules", _Schedules(api), methods=["GET", "POST"]),
                    Route("/schedules/{schedule_id:path}", _Schedules(api),
                          methods=["DELETE"]),
                    Route("/openapi.json", _openapi_json, methods=["GET"])],
            exception_handlers={HTTPException: _http_exception, Exception: _internal_error},
        )
        self._streams = api.streams

    def close_streams(self) -> None:
        """End every open event stream now, and answer new ones 503 ``shutting_down``.

        Call it when the server starts shutting down (event streams never end by themselves,
        so a graceful shutdown would otherwise wait for them). Each stream completes its
        response normally; a browser's EventSource reconnects (elsewhere, or later) and
        resumes after its ``Last-Event-ID``."""
        self._streams.close()


def create_app(
    runtime: SignalRuntime,
    *,
    authorize: Authorize | None = None,
    allow_remote: bool = False,
    heartbeat: float = DEFAULT_HEARTBEAT,
    max_wait: float = DEFAULT_MAX_WAIT,
) -> SignalsApp:
    """An ASGI app (Starlette) that exposes ``runtime`` over HTTP (see the module docstring).

    ``authorize(request, thread_key, action)`` (sync or async) decides every request:
    ``True`` allows it, anything else answers 403 ``forbidden``, a ``PermissionError``
    answers 401 ``unauthorized``. Without it only this machine is served (loopback client,
    loopback ``Host``, no foreign ``Origin``: 403 otherwise) unless ``allow_remote=True``.
    ``heartbeat``: seconds between keep-alive comments on an event stream. ``max_wait``: the
    largest ``?wait=`` accepted. Call :meth:`SignalsApp.close_streams` when the server starts
    shutting down.
    """
    if authorize is not None and not callable(authorize):
        raise TypeError("authorize must be a callable (request, thread_key, action) -> bool")
    if not isinstance(allow_remote, bool):
        raise TypeError("allow_remote must be a bool")
    api = _Api(runtime, authorize, allow_remote, check_seconds("heartbeat", heartbeat,
               positive=True), check_seconds("max_wait", max_wait))
    return SignalsApp(api)


async def _http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 (no route) and 405, as JSON."""
    assert isinstance(exc, HTTPException)
    codes = {404: "not_found", 405: "method_not_allowed"}
    return error_response(exc.status_code, codes.get(exc.status_code, f"http_{exc.status_code}"),
                          exc.detail, exc.headers)


async def _internal_error(request: Request, exc: Exception) -> Response:
    """Anything unexpected: a JSON 500 (the server still logs the traceback)."""
    return error_response(500, "internal_error", "internal server error")


# -- routing ---------------------------------------------------------------------------------

_TEMPLATES = {"signals": "/threads/{key}/signals", "stream": "/threads/{key}/stream",
              "abort": "/threads/{key}/abort", "pause": "/threads/{key}/pause",
              "resume": "/threads/{key}/resume", "signal": "/threads/{key}/signals/{id}",
              "thread": "/threads/{key}"}
_TAILS = frozenset({"signals", "stream", "abort", "pause", "resume"})
_CURSOR = re.compile(r"\d+(-\d+)?")  # the cursors of the built-in stores (as in the CLI)


def _segments(scope: Scope) -> list[str]:
    """The request path split on ``/``, each segment percent-decoded on its own, so that a
    thread key or signal id with ``/`` in it (sent as ``%2F``) stays one segment."""
    raw = scope.get("raw_path")
    if not raw:
        return str(scope["path"]).split("/")
    try:
        return [unquote_to_bytes(s).decode("utf-8") for s in bytes(raw).split(b"/")]
    except UnicodeDecodeError:
        raise HTTPError(400, "bad_request", "the path is not valid UTF-8") from None


def _route(scope: Scope) -> tuple[str, str, str | None]:
    """``(route, thread key, signal id)``, matched from the end of the path (so the app also
    works mounted under a prefix)."""
    s = _segments(scope)
    if len(s) >= 4 and s[-4] == "threads" and s[-2] == "signals":
        return "signal", s[-3], s[-1]
    if len(s) >= 3 and s[-3] == "threads" and s[-1] in _TAILS:
        return s[-1], s[-2], None
    if len(s) >= 2 and s[-2] == "threads":
        return "thread", s[-1], None
    raise HTTPError(404, "not_found", "no such route")


class _Api:
    """The one ASGI endpoint behind ``/threads/...``: route, authorize, call the runtime."""

    def __init__(
        self, runtime: SignalRuntime, authorize: Authorize | None, allow_remote: bool,
        heartbeat: float, max_wait: float,
    ) -> None:
        self.runtime = runtime
        self.authorize = authorize
        self.allow_remote = allow_remote
        self.heartbeat = heartbeat
        self.max_wait = max_wait
        self.streams = StreamRegistry()
        self.telemetry = Telemetry()
        # The largest body read before parsing: twice the signal limit (JSON spacing and
        # escapes differ from the stored form); the runtime then checks the exact size.
        self.body_limit = max(2 * runtime.max_signal_bytes, 64 * 1024)
        self.table: dict[tuple[str, str], tuple[Action, Handler]] = {
            ("signals", "POST"): ("send", self.send),
            ("stream", "GET"): ("stream", self.stream),
            ("thread", "GET"): ("read", self.thread),
            ("abort", "POST"): ("abort", self.abort),
            ("pause", "POST"): ("pause", self.pause),
            ("resume", "POST"): ("pause", self.pause),
            ("signal", "DELETE"): ("cancel", self.cancel),
            ("signal", "GET"): ("read", self.receipt),
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            route = _TEMPLATES.get(_route(scope)[0], "/threads/{key}")
        except HTTPError:
            route = "/threads/{rest}"
        with self.telemetry.server_span(request.headers, request.method, route) as headers:
            try:
                response = await self.handle(request)
            except HTTPError as exc:
                response = exc.response()
        response.headers.update(headers)  # traceparent out, when tracing is on
        await response(scope, receive, send)

    async def handle(self, request: Request) -> Any:
        route, key, signal_id = _route(request.scope)
        entry = self.table.get((route, request.method))
        if entry is None:
            allowed = ", ".join(sorted(m for r, m in self.table if r == route))
            raise HTTPError(405, "method_not_allowed",
                            f"{request.method} is not allowed here (allowed: {allowed})",
                            {"Allow": allowed})
        action, handler = entry
        await check_access(request, key, action, self.authorize, self.allow_remote)
        with runtime_errors():
            return await handler(request, key, signal_id)

    # -- handlers (inside runtime_errors: the runtime's own validation answers 400) ----------

    async def send(self, request: Request, key: str, _: str | None) -> Response:
        wait = query_float(request, "wait", maximum=self.max_wait)
        body = await read_object(request, _SEND_FIELDS, limit=self.body_limit)
        if "payload" not in body:
            raise HTTPError(400, "bad_request", "the body needs a payload (null is fine)")
        signal = Signal(body["payload"], **{k: body[k] for k in _SIGNAL_FIELDS if k in body})
        delivery = await self.runtime.send(
            key, signal, if_active=body.get("if_active", "deliver"),
            if_idle=body.get("if_idle", "wake"), delay_ms=body.get("delay_ms"),
            expires_in_ms=body.get("expires_in_ms"),
        )
        out = delivery_json(delivery)
        if wait is not None and (delivery.duplicate or delivery.outcome in _STORED):
            receipt = await self.runtime.wait_for(key, delivery.signal_id, timeout=wait)
            out["receipt"] = receipt_json(receipt)
        return JSONResponse(out)

    async def stream(self, request: Request, key: str, _: str | None) -> EventStream:
        # EventSource sends Last-Event-ID on a reconnect, with the page's original URL (and
        # its ?after=): the header is the newer of the two.
        after = request.headers.get("last-event-id") or request.query_params.get("after")
        if after and not _CURSOR.fullmatch(after):
            # The stores do not validate cursors (Redis answers a script error): the same
            # check as the CLI's --after, for the built-in stores' cursor forms.
            raise HTTPError(400, "bad_request", f"{after!r} is not a stream cursor")
        follow = query_bool(request, "follow", default=True)
        if self.streams.closing:
            raise HTTPError(503, "shutting_down", "the server is shutting down: reconnect soon",
                            {"Retry-After": "1"})
        # Check the cursor now, while an error can still be a status: the stream's first
        # read is a page of the store (it raises CursorExpiredError) and never blocks.
        async for _part in self.runtime.stream(key, after=after or None, follow=False):
            break
        parts = self.runtime.stream(key, after=after or None, follow=follow)
        return EventStream(parts, heartbeat=self.heartbeat, registry=self.streams)

    async def thread(self, request: Request, key: str, _: str | None) -> Response:
        limit = query_int(request, "limit", default=100, maximum=1000)
        info = await self.runtime.thread(key)
        pending = await self.runtime.pending(key)
        return JSONResponse({
            "thread": thread_json(info),
            "pending": [signal_json(s) for s in pending[:limit]],
            "pending_truncated": len(pending) > limit,
        })

    async def abort(self, request: Request, key: str, _: str | None) -> Response:
        body = await read_object(request, _ABORT_FIELDS, limit=self.body_limit, default={})
        clear = body.get("clear_pending", False)
        if not isinstance(clear, bool):
            raise HTTPError(400, "bad_request", "clear_pending must be true or false")
        aborted = await self.runtime.abort(key, body.get("run_id"), clear_pending=clear,
                                           reason=body.get("reason"))
        return JSONResponse({"aborted": aborted})

    async def pause(self, request: Request, key: str, _: str | None) -> Response:
        pausing = _segments(request.scope)[-1] == "pause"
        was = await (self.runtime.pause(key) if pausing else self.runtime.resume(key))
        return JSONResponse({"thread_key": key, "paused": pausing, "was_paused": was})

    async def cancel(self, request: Request, key: str, signal_id: str | None) -> Response:
        assert signal_id is not None
        if await self.runtime.cancel(key, [signal_id]):
            return JSONResponse({"signal_id": signal_id, "cancelled": True})
        receipt = await self.runtime.receipt(key, signal_id)
        why = ("unknown" if receipt is None
               else "a run holds it" if receipt.status == "pending" else receipt.status)
        raise HTTPError(404, "not_pending", f"signal {signal_id!r} is not pending ({why})")

    async def receipt(self, request: Request, key: str, signal_id: str | None) -> Response:
        assert signal_id is not None
        wait = query_float(request, "wait", maximum=self.max_wait)
        if wait is not None:
            receipt = await self.runtime.wait_for(key, signal_id, timeout=wait)
        else:
            found = await self.runtime.receipt(key, signal_id)
            if found is None:
                raise HTTPError(404, "unknown_signal", f"no signal {signal_id!r} on this thread")
            receipt = found
        return JSONResponse(receipt_json(receipt))
