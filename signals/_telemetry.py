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
import weakref
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from signals._model import Delivery, Signal

__all__ = ["DESTINATION", "HandOutSpans", "Telemetry"]

DESTINATION = "signals.thread"
_SYSTEM = "signals"

otel_context: Any = None
otel_metrics: Any = None
otel_propagate: Any = None
otel_trace: Any = None
HAVE_OTEL: bool | None = None  # the otel extra: None until first looked for


def _have_otel() -> bool:
    """Import the OpenTelemetry API on first use (not at ``import signals``: a sender that
    never traces does not pay for it); ``False`` without the ``otel`` extra."""
    global HAVE_OTEL, otel_context, otel_metrics, otel_trace
    if HAVE_OTEL is None:
        try:
            from opentelemetry import context, metrics, trace
        except ImportError:  # exercised by the plain-install check
            HAVE_OTEL = False
        else:
            otel_context, otel_metrics, otel_trace = context, metrics, trace
            HAVE_OTEL = True
    return HAVE_OTEL


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("signal-leases")
    except Exception:
        return "0"


T = TypeVar("T")
_RECHECK_S = 1.0  # while no provider is set, look for one at most this often


class _Instruments:
    """The meters' instruments, made once per process and meter provider."""

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
        # The runtime's own (docs/operations.md has the table).
        self.active_runs = meter.create_up_down_counter(
            "signals.runs.active", unit="{run}", description="Runs of agents now active")
        self.leases_lost = meter.create_counter(
            "signals.leases.lost", unit="{lease}",
            description="Leases lost by a holder (its run was cancelled)")
        self.dead_letters = meter.create_counter(
            "signals.dead_letters", unit="{signal}",
            description="Signals dead-lettered after max_attempts hand-outs")
        self.duplicates = meter.create_counter(
            "signals.duplicates", unit="{signal}",
            description="Sends refused as duplicates of an accepted signal id")
        self.routing = meter.create_histogram(
            "signals.routing.duration", unit="s",
            description="From a signal's acceptance by send to its first hand-out")
        self.takeover = meter.create_histogram(
            "signals.takeover.duration", unit="s",
            description="From a signal's acceptance to its hand-out again by a run that took "
                        "the thread over from an owner that died or lost its lease")
        meter.create_observable_gauge(
            "signals.pending", callbacks=[_observe_pending], unit="{signal}",
            description="Signals not yet acknowledged in the threads this process's runs hold")


class _FromProvider(Generic[T]):
    """What ``find`` makes from one of OpenTelemetry's global providers (``None`` while no SDK
    provider is set), looked up at most every ``_RECHECK_S`` until found and then kept: a
    provider is set once per process and never changes."""

    __slots__ = ("_at", "_find", "value")

    def __init__(self, find: Callable[[], T | None]) -> None:
        self._find = find
        self._at = 0.0
        self.value: T | None = None

    def get(self) -> T | None:
        if self.value is not None:
            return self.value
        now = time.monotonic()
        if now < self._at:
            return None
        if not _have_otel():
            self._at = float("inf")  # no otel extra: never look again
            return None
        self._at = now + _RECHECK_S
        self.value = self._find()
        return self.value


def _find_tracer() -> Any:
    global otel_propagate
    provider = otel_trace.get_tracer_provider()
    if isinstance(provider, otel_trace.ProxyTracerProvider | otel_trace.NoOpTracerProvider):
        return None
    # The propagators (read from the environment through entry points: a few ms) only once
    # there are spans whose context to carry: every use of them follows a tracer.
    from opentelemetry import propagate

    otel_propagate = propagate
    return provider.get_tracer("signals", _version())


def _find_instruments() -> _Instruments | None:
    provider = otel_metrics.get_meter_provider()
    if type(provider).__name__ in ("_ProxyMeterProvider", "NoOpMeterProvider"):
        return None
    return _Instruments(provider.get_meter("signals", _version()))


class _Providers:
    """This process's tracer and instruments, and the runtimes the ``signals.pending`` gauge
    sums."""

    def __init__(self) -> None:
        self.tracer: _FromProvider[Any] = _FromProvider(_find_tracer)
        self.instruments: _FromProvider[_Instruments] = _FromProvider(_find_instruments)
        self.runtimes: weakref.WeakSet[Telemetry] = weakref.WeakSet()


_PROVIDERS = _Providers()


def _observe_pending(options: Any) -> list[Any]:
    total = sum(t.pending() for t in list(_PROVIDERS.runtimes))
    return [otel_metrics.Observation(total)]


class Telemetry:
    """One runtime's spans and metrics. Its only process-wide state mirrors OpenTelemetry's
    own global providers (and the one ``signals.pending`` gauge that sums this process's
    runtimes)."""

    def __init__(self, pending: Callable[[], int] | None = None) -> None:
        self._pending = pending
        if pending is not None:
            _PROVIDERS.runtimes.add(self)

    def pending(self) -> int:
        return self._pending() if self._pending is not None else 0

    # -- whether anything is configured -----------------------------------------------------

    @staticmethod
    def quiet() -> bool:
        """True when neither tracing nor metrics are configured: a send records nothing."""
        return _PROVIDERS.tracer.get() is None and _PROVIDERS.instruments.get() is None

    @staticmethod
    def tracer() -> Any:
        """The tracer, or ``None`` when no SDK provider is set (or no API installed)."""
        return _PROVIDERS.tracer.get()

    @staticmethod
    def instruments() -> _Instruments | None:
        """The instruments, or ``None`` when no SDK meter provider is set."""
        return _PROVIDERS.instruments.get()

    # -- the runtime's own metrics ----------------------------------------------------------

    @staticmethod
    def count(name: str, value: int = 1) -> None:
        """Add ``value`` to the runtime counter ``name`` (``active_runs``, ``leases_lost``,
        ``dead_letters``, ``duplicates``)."""
        instruments = _PROVIDERS.instruments.get()
        if instruments is not None:
            getattr(instruments, name).add(value)

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

    async def traced_send(self, thread_key: str, signal: Signal,
                          send: Callable[[Signal], Awaitable[Delivery]]) -> Delivery:
        """``await send(signal)`` inside the ``send`` span (``signal`` with its trace context),
        timed for the operation metric. Callers skip it when :meth:`quiet` (a frame fewer on
        the hot path)."""
        started = time.perf_counter()
        span, signal = self.start_send(thread_key, signal)
        try:
            delivery = await send(signal)
        except BaseException as exc:
            self.end_send(span, started, None, exc)
            raise
        self.end_send(span, started, delivery.outcome, None)
        return delivery

    def end_send(self, span: Any, started: float, outcome: str | None,
                 error: BaseException | None) -> None:
        instruments = self.instruments()
        if instruments is not None:
            attrs = _SEND_ATTRS
            if error is not None:
                attrs = {**attrs, "error.type": type(error).__name__}
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
                      parts: list[Signal], *, taken_over: bool = False) -> Any:
        """A CONSUMER span for one hand-out (``parts``: the signals a folded one stands
        for), made current in the calling task; ``None`` when tracing is off.
        ``taken_over``: the run took the thread over from an owner that died or lost it."""
        instruments = self.instruments()
        if instruments is not None:
            instruments.consumed.add(len(parts), _PROCESS_ATTRS)
            if signal.attempt == 1 or taken_over:
                now = time.time()
                histogram = instruments.routing if signal.attempt == 1 else instruments.takeover
                for part in parts:
                    histogram.record(max(0.0, now - part.created_at))
        tracer = self.tracer()
        if tracer is None:
            return _Timed(None, None) if instruments is not None else None
        contexts = [otel_propagate.extract(s.trace_context) for s in parts if s.trace_context]
        parent = contexts[0] if len(parts) == 1 and contexts else None
        links = ([otel_trace.Link(otel_trace.get_current_span(c).get_span_context())
                  for c in contexts] if len(parts) > 1 else None)
        attrs = _attributes("process", "process", thread_key, signal)
        attrs["signals.run_id"] = run_id
        attrs["signals.attempt"] = signal.attempt  # above 1: a retry
        if taken_over:
            attrs["signals.taken_over"] = True  # the run took the thread over
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
            attrs = _PROCESS_ATTRS
            if error is not None:
                attrs = dict(attrs)
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
        if not _have_otel():
            return
        span = otel_trace.get_current_span()
        if span.is_recording():
            span.add_event(name, {k: v for k, v in attributes.items() if v is not None})


class HandOutSpans:
    """The process spans of one run's hand-outs. Each starts when a signal is handed to the
    agent, is the current span in the agent's task until the next hand-out, and ends at the
    signal's ack, or with the run."""

    __slots__ = ("_current", "_telemetry")

    def __init__(self, telemetry: Telemetry) -> None:
        self._telemetry = telemetry
        self._current: Any = None  # the handle whose span is the current one

    def start(self, thread_key: str, run_id: str, signal: Signal, entries: Sequence[Any], *,
              taken_over: bool) -> Any:
        """A hand-out of ``signal`` (``entries``: the inbox entries it stands for): its
        handle, for :meth:`end`; ``None`` while nothing is configured."""
        if self._current is None and self._telemetry.quiet():
            return None
        if self._current is not None:
            self._current.detach()  # the previous one stops being current (it ends at its ack)
        self._current = self._telemetry.start_process(
            thread_key, run_id, signal, [e.signal for e in entries], taken_over=taken_over)
        return self._current

    def end(self, handle: Any, error: str | None = None) -> None:
        """A hand-out's span ends: at its ack (``error`` ``None``), or with the run."""
        if handle is not None:
            if handle is self._current:
                self._current = None
            self._telemetry.end_process(handle, error)

    def end_all(self, handles: Iterable[Any], error: str | None) -> None:
        """The run ended: end the spans of what it never acknowledged (``error``: why)."""
        if self._current is not None:
            self._current.detach()
            self._current = None
        for handle in handles:
            self.end(handle, error or "not acknowledged")


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


_PROCESS_ATTRS = {"messaging.system": _SYSTEM, "messaging.operation.name": "process",
                  "messaging.destination.name": DESTINATION}
_SEND_ATTRS = {"messaging.system": _SYSTEM, "messaging.operation.name": "send",
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
