"""Traces and metrics through the OpenTelemetry API (the ``otel`` extra), by the OpenTelemetry
messaging conventions (docs/operations.md).

Without ``opentelemetry-api`` installed, or with it and no SDK configured (no tracer or meter
provider set), :class:`Telemetry` does nothing and costs one check per call. With them:

* ``send`` is a PRODUCER span ``send signals.thread``; its W3C trace context is stored with
  the signal in the inbox (``Signal.trace_context``);
* each hand-out is a CONSUMER span ``process signals.thread``: a child of the sender's span
  (for a folded signal, linked to each sender's span instead), current while the agent works
  on the signal, ended when it is acknowledged (or the run ends);
* metrics: ``messaging.client.sent.messages``, ``messaging.client.operation.duration``,
  ``messaging.client.consumed.messages``, ``messaging.process.duration``.

The destination name is the template ``signals.thread``, never the thread key (bounded
cardinality); the thread key is ``messaging.message.conversation_id`` and
``gen_ai.conversation.id`` on spans only.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from signals._model import Signal

__all__ = ["DESTINATION", "Telemetry"]

DESTINATION = "signals.thread"
_SYSTEM = "signals"

otel_context: Any
otel_metrics: Any
otel_propagate: Any
otel_trace: Any
try:  # the otel extra
    from opentelemetry import context as otel_context
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import propagate as otel_propagate
    from opentelemetry import trace as otel_trace

    HAVE_OTEL = True
except ImportError:  # exercised by the plain-install check
    HAVE_OTEL = False


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("signal-leases")
    except Exception:
        return "0"


class _Instruments:
    """The meters' instruments, made once per meter provider."""

    def __init__(self, meter: Any) -> None:
        self.sent = meter.create_counter(
            "messaging.client.sent.messages", unit="{message}",
            description="Signals accepted by send")
        self.consumed = meter.create_counter(
            "messaging.client.consumed.messages", unit="{message}",
            description="Signals handed to an agent")
        self.operation = meter.create_histogram(
            "messaging.client.operation.duration", unit="s",
            description="Duration of send, from the call to the signal stored and routed")
        self.process = meter.create_histogram(
            "messaging.process.duration", unit="s",
            description="From a signal's hand-out to the agent until its acknowledgement")


class Telemetry:
    """One runtime's spans and metrics (no global state of its own: OpenTelemetry's global
    providers, as the API intends)."""

    def __init__(self) -> None:
        self._tracer: Any = None
        self._tracer_for: Any = None
        self._instruments: _Instruments | None = None
        self._meter_for: Any = None

    # -- whether anything is configured -----------------------------------------------------

    def tracer(self) -> Any:
        """The tracer, or ``None`` when no SDK provider is set (or no API installed)."""
        if not HAVE_OTEL:
            return None
        provider = otel_trace.get_tracer_provider()
        if isinstance(provider, otel_trace.ProxyTracerProvider | otel_trace.NoOpTracerProvider):
            return None
        if provider is not self._tracer_for:
            self._tracer = provider.get_tracer("signals", _version())
            self._tracer_for = provider
        return self._tracer

    def instruments(self) -> _Instruments | None:
        if not HAVE_OTEL:
            return None
        provider = otel_metrics.get_meter_provider()
        if type(provider).__name__ in ("_ProxyMeterProvider", "NoOpMeterProvider"):
            return None
        if provider is not self._meter_for:
            self._instruments = _Instruments(provider.get_meter("signals", _version()))
            self._meter_for = provider
        return self._instruments

    # -- the producer side ------------------------------------------------------------------

    def start_send(self, thread_key: str, signal: Signal) -> tuple[Any, Signal]:
        """A PRODUCER span for ``send`` (``None`` when tracing is off) and ``signal`` with
        the span's trace context in it."""
        tracer = self.tracer()
        if tracer is None:
            return None, signal
        span = tracer.start_span(f"send {DESTINATION}", kind=otel_trace.SpanKind.PRODUCER,
                                 attributes=_attributes("send", "send", thread_key, signal))
        carrier: dict[str, str] = {}
        otel_propagate.inject(carrier, context=otel_trace.set_span_in_context(span))
        return span, signal.with_trace_context(carrier) if carrier else signal

    def end_send(self, span: Any, started: float, outcome: str | None,
                 error: BaseException | None) -> None:
        instruments = self.instruments()
        if instruments is not None:
            attrs = {"messaging.system": _SYSTEM, "messaging.operation.name": "send",
                     "messaging.destination.name": DESTINATION}
            if error is not None:
                attrs["error.type"] = type(error).__name__
            instruments.operation.record(time.perf_counter() - started, attrs)
            if outcome in _STORED:
                instruments.sent.add(1, attrs)
        if span is not None:
            if outcome is not None:
                span.set_attribute("signals.outcome", outcome)
            if error is not None:
                span.record_exception(error)
                span.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR, str(error)))
            span.end()

    # -- the consumer side ------------------------------------------------------------------

    def start_process(self, thread_key: str, run_id: str, signal: Signal,
                      parts: list[Signal]) -> Any:
        """A CONSUMER span for one hand-out (``parts``: the signals a folded one stands
        for), made current in the calling task; ``None`` when tracing is off."""
        instruments = self.instruments()
        if instruments is not None:
            instruments.consumed.add(len(parts), _metric_attrs("process"))
        tracer = self.tracer()
        if tracer is None:
            return _Timed(None, None) if instruments is not None else None
        contexts = [otel_propagate.extract(s.trace_context) for s in parts if s.trace_context]
        parent = contexts[0] if len(parts) == 1 and contexts else None
        links = ([otel_trace.Link(otel_trace.get_current_span(c).get_span_context())
                  for c in contexts] if len(parts) > 1 else None)
        attrs = _attributes("process", "process", thread_key, signal)
        attrs["signals.run_id"] = run_id
        if signal.folded:
            attrs["messaging.batch.message_count"] = len(parts)
        span = tracer.start_span(f"process {DESTINATION}", context=parent, links=links,
                                 kind=otel_trace.SpanKind.CONSUMER, attributes=attrs)
        token = otel_context.attach(otel_trace.set_span_in_context(span))
        return _Timed(span, token)

    def end_process(self, handle: Any, error: str | None = None) -> None:
        if handle is None:
            return
        instruments = self.instruments()
        if instruments is not None:
            attrs = _metric_attrs("process")
            if error is not None:
                attrs["error.type"] = error.partition(":")[0] or "error"
            instruments.process.record(time.perf_counter() - handle.started, attrs)
        span = handle.span
        if span is not None:
            if error is not None:
                span.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR, error))
            span.end()
        handle.detach()

    @contextlib.contextmanager
    def server_span(self, headers: Any, method: str, route: str) -> Any:
        """A SERVER span for one HTTP request, continuing the caller's ``traceparent``, current
        while the request is handled; yields the headers that carry it back (``traceparent``)
        for the response (empty when tracing is off)."""
        tracer = self.tracer()
        if tracer is None:
            yield {}
            return
        parent = otel_propagate.extract(dict(headers))
        span = tracer.start_span(f"{method} {route}", context=parent,
                                 kind=otel_trace.SpanKind.SERVER,
                                 attributes={"http.request.method": method, "http.route": route})
        token = otel_context.attach(otel_trace.set_span_in_context(span))
        out: dict[str, str] = {}
        otel_propagate.inject(out)
        try:
            yield out
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR, str(exc)))
            raise
        finally:
            with contextlib.suppress(Exception):
                otel_context.detach(token)
            span.end()

    @staticmethod
    def event(name: str, **attributes: Any) -> None:
        """An event on the current span (a run's lease lost, an interrupt, a dead letter)."""
        if not HAVE_OTEL:
            return
        span = otel_trace.get_current_span()
        if span.is_recording():
            span.add_event(name, {k: v for k, v in attributes.items() if v is not None})


class _Timed:
    __slots__ = ("span", "started", "token")

    def __init__(self, span: Any, token: Any) -> None:
        self.span = span
        self.token = token
        self.started = time.perf_counter()

    def detach(self) -> None:
        token, self.token = self.token, None
        if token is not None:
            with contextlib.suppress(Exception):  # attached in another context: harmless
                otel_context.detach(token)


_STORED = frozenset({"wake", "deliver", "queued", "scheduled"})


def _metric_attrs(operation: str) -> dict[str, Any]:
    return {"messaging.system": _SYSTEM, "messaging.operation.name": operation,
            "messaging.destination.name": DESTINATION}


def _attributes(name: str, kind: str, thread_key: str, signal: Signal) -> dict[str, Any]:
    return {
        "messaging.system": _SYSTEM,
        "messaging.operation.name": name,
        "messaging.operation.type": kind,
        "messaging.destination.name": DESTINATION,
        "messaging.message.id": signal.id,
        "messaging.message.conversation_id": thread_key,
        "gen_ai.conversation.id": thread_key,
    }
