"""The OpenAPI 3.1 document of :mod:`signals.http` (``GET /openapi.json``): every route, its
parameters, bodies and error shapes, as docs/http.md describes them."""

from __future__ import annotations

from typing import Any

from _signal_leases.validation import MAX_UNIX_TIME

__all__ = ["openapi"]

_ERROR = {"$ref": "#/components/schemas/Error"}
_ERRORS = {str(code): {"description": text, "content": {"application/json": {"schema": _ERROR}}}
           for code, text in (
               (400, "Bad input (the message names it)"),
               (401, "Missing or invalid credentials (authorize raised PermissionError)"),
               (403, "Not allowed"),
               (404, "No such route, signal or schedule"),
               (405, "Method not allowed"),
               (410, "The stream cursor is older than the stream retains"),
               (413, "The body is too large"),
               (415, "The body is not application/json"),
               (502, "The backend refused the request"),
               (503, "The backend is unreachable, or the server is shutting down"),
           )}


def _ok(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"200": {"description": description,
                    "content": {"application/json": {"schema": schema}}}, **_ERRORS}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _path(name: str, description: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "description": description,
            "schema": {"type": "string", "minLength": 1}}


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "description": description,
            "schema": schema}


def _body(schema: dict[str, Any], required: bool = True) -> dict[str, Any]:
    return {"required": required, "content": {"application/json": {"schema": schema}}}


_KEY = _path("key", "The thread key (one percent-encoded path segment)")
_ID = _path("id", "The signal id")
_WAIT = _query("wait", {"type": "number", "minimum": 0},
               "Seconds to wait for the receipt to be final (at most the app's max_wait)")
_NULLABLE_STR = {"type": ["string", "null"]}
_NULLABLE_NUM = {"type": ["number", "null"]}
_NULLABLE_INT = {"type": ["integer", "null"]}
_NULLABLE_TIME = {"type": ["number", "null"], "minimum": 0, "maximum": MAX_UNIX_TIME}

_SIGNAL_FIELDS: dict[str, Any] = {
    "payload": {"description": "Any JSON value (null too)"},
    "type": {"type": "string"},
    "priority": {"type": "integer"},
    "lane": _NULLABLE_STR,
    "merge": {"enum": ["append", "supersede", "coalesce"]},
    "cache_key": _NULLABLE_STR,
    "not_before": _NULLABLE_TIME,
    "expires_at": _NULLABLE_TIME,
    "debounce_ms": _NULLABLE_INT,
    "max_wait_ms": _NULLABLE_INT,
}

_SCHEMAS: dict[str, Any] = {
    "Error": {"type": "object", "required": ["error", "message"],
              "properties": {"error": {"type": "string"}, "message": {"type": "string"}}},
    "Receipt": {"type": "object", "required": ["signal_id", "status"],
                "properties": {"signal_id": {"type": "string"}, "status": {"type": "string"},
                               "run_id": _NULLABLE_STR, "error": _NULLABLE_STR,
                               "at": _NULLABLE_NUM, "done": {"type": "boolean"}}},
    "Delivery": {"type": "object",
                 "required": ["outcome", "signal_id", "thread_key", "duplicate", "backpressure"],
                 "properties": {
                     "outcome": {"type": "string"}, "signal_id": {"type": "string"},
                     "thread_key": {"type": "string"}, "owner": _NULLABLE_STR,
                     "run_id": _NULLABLE_STR, "duplicate": {"type": "boolean"},
                     "backpressure": {"type": "boolean"}, "reason": _NULLABLE_STR,
                     "superseded": {"type": "array", "items": {"type": "string"}},
                     "dropped": {"type": "array", "items": {"type": "string"}},
                     "receipt": {"oneOf": [_ref("Receipt"), {"type": "null"}]}}},
    "SendBody": {"type": "object", "required": ["payload"], "additionalProperties": False,
                 "properties": {**_SIGNAL_FIELDS, "id": {"type": "string"},
                                "if_active": {"enum": ["deliver", "queue", "interrupt",
                                                       "discard", "reject"]},
                                "if_idle": {"enum": ["wake", "enqueue", "discard"]},
                                "delay_ms": _NULLABLE_INT, "expires_in_ms": _NULLABLE_INT}},
    "Thread": {"type": "object", "required": ["thread", "pending", "pending_truncated"],
               "properties": {"thread": {"type": "object"},
                              "pending": {"type": "array", "items": {"type": "object"}},
                              "pending_truncated": {"type": "boolean"}}},
    "AbortBody": {"type": "object", "additionalProperties": False,
                  "properties": {"run_id": _NULLABLE_STR, "clear_pending": {"type": "boolean"},
                                 "reason": _NULLABLE_STR}},
    "Paused": {"type": "object", "required": ["thread_key", "paused", "was_paused"],
               "properties": {"thread_key": {"type": "string"}, "paused": {"type": "boolean"},
                              "was_paused": {"type": "boolean"}}},
    "Schedule": {"type": "object", "required": ["schedule_id", "thread_key", "signal"],
                 "properties": {"schedule_id": {"type": "string"},
                                "thread_key": {"type": "string"}, "signal": {"type": "object"},
                                "every_ms": _NULLABLE_INT, "cron": _NULLABLE_STR,
                                "tz": {"type": "string"}, "catch_up": {"type": "string"},
                                "next_at": {"type": "number"}}},
    "ScheduleBody": {"type": "object", "additionalProperties": False,
                     "required": ["schedule_id", "thread_key", "signal"],
                     "properties": {"schedule_id": {"type": "string"},
                                    "thread_key": {"type": "string"},
                                    "signal": {"type": "object", "required": ["payload"],
                                               "additionalProperties": False,
                                               "properties": _SIGNAL_FIELDS},
                                    "every_ms": _NULLABLE_INT, "cron": _NULLABLE_STR,
                                    "tz": {"type": "string"},
                                    "catch_up": {"enum": ["latest", "all", "none"]}}},
}


def openapi(title: str = "signals.http", version: str = "1") -> dict[str, Any]:
    """The OpenAPI document of the app."""
    paths: dict[str, Any] = {
        "/threads/{key}/signals": {"post": {
            "summary": "Send a signal (runtime.send; ?wait=S also waits for its receipt)",
            "parameters": [_KEY, _WAIT], "requestBody": _body(_ref("SendBody")),
            "responses": _ok(_ref("Delivery"))}},
        "/threads/{key}/stream": {"get": {
            "summary": "The thread's output stream as Server-Sent Events",
            "parameters": [_KEY, _query("after", {"type": "string"}, "Start after this cursor"),
                           _query("follow", {"type": "boolean"}, "Follow live (default true)")],
            "responses": {"200": {"description": "text/event-stream",
                                  "content": {"text/event-stream": {"schema": {"type": "string"}}}},
                          **_ERRORS}}},
        "/threads/{key}": {"get": {
            "summary": "The thread and its pending signals",
            "parameters": [_KEY, _query("limit", {"type": "integer", "minimum": 0,
                                                   "maximum": 1000}, "At most this many")],
            "responses": _ok(_ref("Thread"))}},
        "/threads/{key}/abort": {"post": {
            "summary": "Abort the active run", "parameters": [_KEY],
            "requestBody": _body(_ref("AbortBody"), required=False),
            "responses": _ok({"type": "object", "required": ["aborted"],
                              "properties": {"aborted": {"type": "boolean"}}})}},
        "/threads/{key}/pause": {"post": {
            "summary": "Pause the thread for every process", "parameters": [_KEY],
            "responses": _ok(_ref("Paused"))}},
        "/threads/{key}/resume": {"post": {
            "summary": "Resume a paused thread", "parameters": [_KEY],
            "responses": _ok(_ref("Paused"))}},
        "/threads/{key}/signals/{id}": {
            "get": {"summary": "The receipt of a signal (?wait=S: once final)",
                    "parameters": [_KEY, _ID, _WAIT], "responses": _ok(_ref("Receipt"))},
            "delete": {"summary": "Withdraw a queued signal", "parameters": [_KEY, _ID],
                       "responses": _ok({"type": "object",
                                         "required": ["signal_id", "cancelled"],
                                         "properties": {"signal_id": {"type": "string"},
                                                        "cancelled": {"type": "boolean"}}})}},
        "/schedules": {
            "get": {"summary": "Every schedule (of the threads the caller may read)",
                    "responses": _ok({"type": "object", "required": ["schedules"],
                                      "properties": {"schedules": {
                                          "type": "array", "items": _ref("Schedule")}}})},
            "post": {"summary": "Create or update a schedule",
                     "requestBody": _body(_ref("ScheduleBody")),
                     "responses": _ok(_ref("Schedule"))}},
        "/schedules/{id}": {"delete": {
            "summary": "Remove a schedule", "parameters": [_path("id", "The schedule id")],
            "responses": _ok({"type": "object", "required": ["schedule_id", "removed"],
                              "properties": {"schedule_id": {"type": "string"},
                                             "removed": {"type": "boolean"}}})}},
    }
    return {"openapi": "3.1.0", "info": {"title": title, "version": version},
            "paths": paths, "components": {"schemas": _SCHEMAS}}
