"""``PubSubBase``: the public base class of the built-in backends (and of yours, if you like).

It implements the :class:`~pubsub.PubSub` protocol's entry points once: ``publish`` and
``subscribe`` validate their arguments and the open/closed state, then call the backend's
hooks, which trust their caller. It also runs the lifecycle (``async with``: a task group for
the subscriptions, a graceful close on a clean exit) and holds the per-instance extension
registry.
"""

from __future__ import annotations

import weakref
from abc import ABCMeta, abstractmethod
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from typing import TYPE_CHECKING, ClassVar, Self, TypeVar, cast

from anyio import AsyncContextManagerMixin

from _signal_leases.aio import owned_task_group
from _signal_leases.errors import ClosedError
from _signal_leases.validation import check_choice, check_identifier, check_int, check_str
from pubsub._contract import (
    DEFAULT_MAX_DELIVERY_ATTEMPTS,
    START_FROM,
    Event,
    EventHandler,
    StartFrom,
    Subscription,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from anyio.abc import TaskGroup

__all__ = ["PubSubBase"]

T = TypeVar("T")


class PubSubBase(AsyncContextManagerMixin, metaclass=ABCMeta):
    """A :class:`~pubsub.PubSub` skeleton: validation, lifecycle and extensions, done once.

    :meth:`publish` checks ``topic`` (an identifier: a non-empty ``str`` without control
    characters), ``event`` (an :class:`~pubsub.Event` whose data still encodes as JSON), then
    that the backend is open, and calls :meth:`backend_publish`. :meth:`subscribe` checks
    ``topic``, ``handler`` (callable), ``group`` (``None`` or an identifier, not starting with
    :attr:`reserved_group_prefix`) and ``start_from``, then calls :meth:`backend_subscribe`.
    ``TypeError`` for a wrong type, ``ValueError`` for a wrong value, ``ClosedError``
    before ``async with`` or after :meth:`close`.

    Lifecycle: ``async with backend:`` enters :meth:`backend_lifespan`, then opens the task
    group (:attr:`task_group`) the subscriptions' tasks run in. A clean exit calls
    :meth:`close` (in-flight handlers finish); an exit by an exception or cancellation cancels
    them instead, and the body's exception propagates unchanged. A backend is entered once.

    Extensions: :meth:`extension` returns one object per name and pub/sub instance, built by
    the first caller's factory. The signal runtime keeps its store there, so that every
    runtime built on the same pub/sub shares one store.

    Subclasses implement two hooks, called only with validated arguments on an open backend:

    * ``async backend_publish(topic, event, wire)``: accept ``event`` (``wire`` is its JSON
      form, ``event.to_json()``, already computed);
    * ``async backend_subscribe(topic, handler, *, group, start_from) -> Subscription``: start
      delivery, running tasks in :attr:`task_group`.

    and may override :meth:`backend_lifespan` (resources held while entered) and :meth:`close`
    (calling ``super().close()``). Subscriptions must support weak references (the base keeps
    a weak set of them, to close those still running).
    """

    #: Group names starting with this belong to the backend; ``subscribe`` refuses them.
    reserved_group_prefix: ClassVar[str | None] = None
    #: Whether ``publish`` works before ``async with`` (it needs no background task).
    publish_before_entering: ClassVar[bool] = False

    def __init__(self, *, max_delivery_attempts: int = DEFAULT_MAX_DELIVERY_ATTEMPTS) -> None:
        self.max_delivery_attempts = check_int("max_delivery_attempts", max_delivery_attempts)
        self._extensions: dict[str, object] = {}
        self._subscriptions: weakref.WeakSet[Subscription] = weakref.WeakSet()
        self._task_group: TaskGroup | None = None
        self._entered = False
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------

    @asynccontextmanager
    async def __asynccontextmanager__(self) -> AsyncIterator[Self]:
        name = type(self).__name__
        if self._entered or self._closed:
            raise ClosedError(f"a {name} can be entered once")
        self._entered = True
        try:
            async with self.backend_lifespan(), owned_task_group() as tg:
                self._task_group = tg
                yield self
                await self.close()  # a clean exit: in-flight handlers finish
        finally:
            self._closed = True
            self._task_group = None

    def backend_lifespan(self) -> AbstractAsyncContextManager[None]:
        """Hook: what the backend holds while entered (connections, background loops). Its
        exit runs after every subscription task has ended. The default holds nothing."""
        return nullcontext()

    async def close(self) -> None:
        """Close every subscription (in-flight handlers finish first) and refuse further use
        (idempotent). Resources are released when ``async with`` exits."""
        self._closed = True
        for subscription in list(self._subscriptions):
            await subscription.close()

    @property
    def task_group(self) -> TaskGroup:
        """The task group of the entered backend (for subclasses: subscription tasks)."""
        self._check_open()
        assert self._task_group is not None
        return self._task_group

    def _check_open(self, *, publishing: bool = False) -> None:
        name = type(self).__name__
        if self._closed:
            raise ClosedError(f"this {name} is closed")
        if self._task_group is None and not (publishing and self.publish_before_entering):
            raise ClosedError(f"enter the {name} first: `async with {name}(...)`")

    # -- the contract ----------------------------------------------------------------------

    async def publish(self, topic: str, event: Event) -> str:
        """Publish ``event`` on ``topic``; returns the event id."""
        check_identifier("topic", topic)
        if not isinstance(event, Event):
            raise TypeError(f"publish takes a pubsub.Event, got {type(event).__name__}")
        wire = event.to_json()  # TypeError if the data was mutated into non-JSON since
        self._check_open(publishing=True)
        await self.backend_publish(topic, event, wire)
        return event.id

    async def subscribe(
        self,
        topic: str,
        handler: EventHandler,
        *,
        group: str | None = None,
        start_from: StartFrom = "latest",
    ) -> Subscription:
        """Deliver the events of ``topic`` to ``handler`` until the subscription is closed."""
        check_identifier("topic", topic)
        if not callable(handler):
            raise TypeError("handler must be an async callable taking an Event")
        if group is not None:
            check_identifier("group", group)
            reserved = self.reserved_group_prefix
            if reserved is not None and group.startswith(reserved):
                raise ValueError(f"group names starting with {reserved!r} are reserved")
        check_choice("start_from", start_from, START_FROM)
        self._check_open()
        subscription = await self.backend_subscribe(
            topic, handler, group=group, start_from=start_from
        )
        self._subscriptions.add(subscription)
        if self._closed:  # close() ran while this one was opening, and did not see it
            await subscription.close()
            self._check_open()
        return subscription

    async def unsubscribe(self, subscription: Subscription) -> None:
        """Close ``subscription`` (same as ``await subscription.close()``)."""
        await subscription.close()

    def extension(self, name: str, factory: Callable[[], T]) -> T:
        """The object registered under ``name`` on this pub/sub instance, built by calling
        ``factory()`` the first time ``name`` is asked for (the same object afterwards)."""
        check_str("name", name)
        if name not in self._extensions:
            self._extensions[name] = factory()
        return cast(T, self._extensions[name])

    # -- hooks -----------------------------------------------------------------------------

    @abstractmethod
    async def backend_publish(self, topic: str, event: Event, wire: str) -> None:
        """Hook: accept ``event`` on ``topic`` (``wire`` is ``event.to_json()``)."""

    @abstractmethod
    async def backend_subscribe(
        self, topic: str, handler: EventHandler, *, group: str | None, start_from: StartFrom
    ) -> Subscription:
        """Hook: start delivering ``topic`` to ``handler``; return the subscription."""
