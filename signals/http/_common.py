"""Shared pieces of :mod:`signals.http`: the JSON error, the mapping of the library's errors to
HTTP statuses, request parsing (bounded JSON bodies, query values) and the JSON forms of the
runtime's value types.

Every error the HTTP layer answers is ``{"error": "<stable code>", "message": "..."}`` (see
``docs/http.md`` for the table); nothing here ever renders a traceback.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from _signal_leases.errors import (
    BackendError,
    BackendUnavailableError,
    ClosedError,
    CursorExpiredError,
    SignalTooLargeError,
    UnknownSignalError,
)
from signals._model import Delivery, Receipt, Signal, StreamPart, ThreadInfo
from signals._schedules import Schedule

__all__ = [
    "HTTPError",
    "classify",
    "delivery_json",
    "error_response",
    "part_json",
    "query_bool",
    "query_float",
    "query_int",
    "read_json",
    "receipt_json",
    "runtime_errors",
    "signal_json",
    "thread_json",
]


class HTTPError(Exception):
    """An error answered as ``{"error": code, "message": message}`` with ``status``."""

    def __init__(
        self, status: int, code: str, message: str, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})

    def response(self) -> JSONResponse:
        return error_response(self.status, self.code, self.message, self.headers)


def error_response(
    status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """The JSON error body every failure of the HTTP layer uses."""
    return JSONResponse({"error": code, "message": message}, status_code=status,
                        headers=dict(headers or {}))


def classify(exc: BaseException) -> HTTPError | None:
    """The HTTP form of an error the runtime raises on purpose (``None``: not one of them).

    Order matters: ``SignalTooLargeError`` is a ``ValueError``, ``UnknownSignalError`` and
    ``CursorExpiredError`` are ``LookupError``s, ``BackendUnavailableError`` is a
    ``ConnectionError`` (an ``OSError``)."""
    message = str(exc) or type(exc).__name__
    if isinstance(exc, SignalTooLargeError):
        return HTTPError(413, "too_large", message)
    if isinstance(exc, UnknownSignalError):
        return HTTPError(404, "unknown_signal", message)
    if isinstance(exc, CursorExpiredError):
        return HTTPError(410, "cursor_expired", message)
    if isinstance(exc, BackendUnavailableError):
        return HTTPError(503, "backend_unavailable", message, {"Retry-After": "1"})
    if isinstance(exc, BackendError):
        return HTTPError(502, "backend_error", message)
    if isinstance(exc, ClosedError):
        return HTTPError(503, "runtime_closed", message, {"Retry-After": "1"})
    if isinstance(exc, ValueError | TypeError):
        return HTTPError(400, "bad_request", message)
    return None


@contextmanager
def runtime_errors() -> Iterator[None]:
    """Turn the runtime's deliberate errors (validation, size, backend, unknown ids) into
    :class:`HTTPError`; anything else propagates (a 500, logged by the server)."""
    try:
        yield
    except HTTPError:
        raise
    except Exception as exc:
        mapped = classify(exc)
        if mapped is None:
            raise
        raise mapped from exc


_NO_BODY: Any = object()


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


async def read_object(request: Request, fields: frozenset[str], *, limit: int,
                      default: Any = _NO_BODY) -> dict[str, Any]:
    """The request's JSON body (see :func:`read_json`), which must be an object with no field
    outside ``fields`` (400 ``bad_request`` naming them: a typo never passes silently)."""
    body = await read_json(request, limit=limit, default=default)
    if not isinstance(body, dict):
        raise HTTPError(400, "bad_request", "the body must be a JSON object")
    unknown = sorted(set(body) - fields)
    if unknown:
        raise HTTPError(400, "bad_request", f"unknown fields: {', '.join(unknown)}")
    return body


async def read_json(request: Request, *, limit: int, default: Any = _NO_BODY) -> Any:
    """The request's JSON body, read up to ``limit`` bytes (413 ``too_large`` beyond).

    An empty body is ``default`` (400 when there is none). A non-empty body must say
    ``Content-Type: application/json`` (415 ``unsupported_media_type``: a browser cannot send
    that cross-site without a CORS preflight) and be strict JSON (400 ``bad_json``)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPError(413, "too_large", f"the body is {declared} bytes, over {limit}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise HTTPError(413, "too_large", f"the body is over {limit} bytes")
    if not body.strip():
        if default is _NO_BODY:
            raise HTTPError(400, "bad_request", "a JSON body is required")
        return default
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "application/json":
        raise HTTPError(415, "unsupported_media_type",
                        f"send the body as Content-Type: application/json (got {media or 'none'})")
    try:
        return json.loads(bytes(body), parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise HTTPError(400, "bad_json", f"the body is not valid JSON: {exc}") from None


def query_float(request: Request, name: str, *, maximum: float) -> float | None:
    """``?name=SECONDS`` as a float in ``[0, maximum]`` (``None`` when absent)."""
    raw = request.query_params.get(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise HTTPError(400, "bad_request", f"{name} must be a number, got {raw!r}") from None
    if not math.isfinite(value) or not 0 <= value <= maximum:
        raise HTTPError(400, "bad_request", f"{name} must be between 0 and {maximum:g}")
    return value


def query_int(request: Request, name: str, *, default: int, maximum: int) -> int:
    """``?name=N`` as an int in ``[0, maximum]``."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or int(raw) > maximum:
        raise HTTPError(400, "bad_request", f"{name} must be an integer from 0 to {maximum}")
    return int(raw)


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def query_bool(request: Request, name: str, *, default: bool) -> bool:
    """``?name=true|false`` (also ``1/0``, ``yes/no``, ``on/off``)."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if raw.lower() in _TRUE:
        return True
    if raw.lower() in _FALSE:
        return False
    raise HTTPError(400, "bad_request", f"{name} must be true or false, got {raw!r}")


# -- JSON forms of the runtime's values -----------------------------------------------------


def receipt_json(receipt: Receipt) -> dict[str, Any]:
    """A :class:`Receipt` with its ``done`` flag."""
    return {**asdict(receipt), "done": receipt.done}


def delivery_json(delivery: Delivery) -> dict[str, Any]:
    """A :class:`Delivery` (``run_id`` repeated next to ``owner``, as on the class)."""
    return {
        "outcome": delivery.outcome,
        "signal_id": delivery.signal_id,
        "thread_key": delivery.thread_key,
        "owner": delivery.owner,
        "run_id": delivery.run_id,
        "duplicate": delivery.duplicate,
        "backpressure": delivery.backpressure,
        "receipt": receipt_json(delivery.receipt) if delivery.receipt is not None else None,
        "reason": delivery.reason,
        "superseded": list(delivery.superseded),
        "dropped": list(delivery.dropped),
    }


def part_json(part: StreamPart) -> dict[str, Any]:
    """A :class:`StreamPart`: cursor, thread_key, run_id, kind, data, signal_id, at."""
    return asdict(part)


def thread_json(info: ThreadInfo) -> dict[str, Any]:
    """A :class:`ThreadInfo`."""
    return asdict(info)


def signal_json(signal: Signal) -> dict[str, Any]:
    """A pending :class:`Signal` with its delivery fields (``attempt``: hand-outs so far)."""
    return {**signal.to_dict(), "attempt": signal.attempt, "mode": signal.mode}


def schedule_json(s: Schedule) -> dict[str, Any]:
    """A :class:`~signals.Schedule`."""
    return {"schedule_id": s.schedule_id, "thread_key": s.thread_key,
            "signal": {k: v for k, v in s.signal.to_dict().items()
                       if k not in ("id", "created_at")},
            "every_ms": s.every_ms, "cron": s.cron, "tz": s.tz, "catch_up": s.catch_up,
            "next_at": s.next_at}
