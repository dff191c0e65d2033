"""The reference engine: the rules of :mod:`signals.kit._rules` and, with a
:class:`~signals.kit._tables.LeaseAccess`, the fused calls (route, claim, release, abort) that
read and grant the thread's lease in the same transaction as the inbox step.
"""

from __future__ import annotations

from signals._model import EntryMode, Signal
from signals.kit._capabilities import CARRY_LIMIT, Claim, Claimed, Notice, Routed
from signals.kit._core import Limits, run_runtime
from signals.kit._rules import Outbox, Rules, emptied, entry_of
from signals.kit._tables import Tables, ThreadRow

__all__ = ["Engine", "Outbox"]


class Engine(Rules):
    """See the module docstring. ``retention_ms`` / ``max_receipts``: receipts (the dedup
    window) per thread."""

    # -- fused with the leases --------------------------------------------------------------

    def route(self, t: Tables, key: str, signal: Signal, mode: EntryMode, claim: Claim | None,
              sender: str | None, wake_workers: bool, limits: Limits,
              outbox: Outbox, interrupt: bool = False) -> Routed:
        leases = t.leases
        assert leases is not None, "fused calls need the engine's leases"
        accepted, th, e = self.accept(t, key, signal, mode, limits, index=False, save=False)
        live = leases.live(key)
        owner = live[0] if live is not None else None
        if not accepted.fresh or e is None:
            return Routed(accepted, owner)
        ready = accepted.due_at is None
        carry = (owner is not None and ready and mode == "deliver" and not th.paused
                 and not interrupt and len(e.body) <= CARRY_LIMIT)
        if carry:  # handed to the owner with its notice: stored as carried already
            e.state, e.holder, e.attempts = "carried", owner, 1
        t.insert(e)
        if owner is not None and not ready:
            t.save_thread(th)
            outbox.add(None, Notice("due", key, reason=repr(accepted.due_at)))
            return Routed(accepted, owner)
        if owner is not None and interrupt:  # the owner stops; the signal waits for the next run
            _abort_run(th, key, owner, "interrupt", outbox)
            self._index(th, t.now)
            t.save_thread(th)
            return Routed(accepted, owner)
        if owner is not None:
            carried = None
            if carry:
                self._received(t, key, owner, e.sid, 1)
                carried = entry_of(e)
            if run_runtime(owner) != sender:
                outbox.add(run_runtime(owner), Notice("signal", key, owner, entry=carried))
            self._index(th, t.now)  # hidden while the lease lives; found if the owner dies
            t.save_thread(th)
            return Routed(accepted, owner, carried=carried is not None)
        if claim is not None and ready and not th.paused:
            token = leases.grant(key, claim.owner, claim.ttl_ms, claim.session)
            if token is not None:
                th.since = t.now
                self._index(th, t.now)  # hidden while the lease lives; found when it is gone
                t.save_thread(th)
                return Routed(accepted, claim.owner, True, token)
        self._index(th, t.now if ready else (accepted.due_at or t.now))
        t.save_thread(th)
        if wake_workers and not th.paused:
            outbox.add(None, Notice("work", key) if ready
                       else Notice("due", key, reason=repr(accepted.due_at)))
        return Routed(accepted)

    def claim(self, t: Tables, key: str, claim: Claim, outbox: Outbox) -> Claimed:
        leases = t.leases
        assert leases is not None, "fused calls need the engine's leases"
        th = t.thread(key)
        if th is None or th.pending == 0 or th.paused:
            if th is not None:
                th.look = None
                t.save_thread(th)
            return Claimed(empty=True)
        self._ripen(t, th)
        live = leases.live(key)
        work = self._has_work(t, th)
        if live is not None:  # the index hides it while the lease lives (Tables.due_threads)
            t.save_thread(th)
            if work:
                outbox.add(run_runtime(live[0]), Notice("signal", key, live[0]))
            return Claimed(owner=live[0])
        if not work:
            th.look = t.next_due(key)
            emptied(th)
            t.save_thread(th)
            return Claimed(empty=True, next_due=th.look)
        token = leases.grant(key, claim.owner, claim.ttl_ms, claim.session)
        if token is None:
            return Claimed()
        th.since = t.now
        t.save_thread(th)  # still indexed: found again as soon as the lease is gone
        return Claimed(claimed=True, owner=claim.owner, token=token)

    def release_if_idle(self, t: Tables, key: str, owner: str) -> bool:
        leases = t.leases
        assert leases is not None, "fused calls need the engine's leases"
        th = t.thread(key)
        if th is not None:
            self._ripen(t, th)
            if not th.paused and self._has_work(t, th):
                t.save_thread(th)
                return False
            th.look = None if th.paused else t.next_due(key)
            emptied(th)
            t.save_thread(th)
        live = leases.live(key)
        if live is not None and live[0] == owner:
            leases.release(key, owner)
        return True

    def abort(self, t: Tables, key: str, run_id: str | None, reason: str, clear: bool,
              outbox: Outbox) -> str | None:
        leases = t.leases
        assert leases is not None, "fused calls need the engine's leases"
        live = leases.live(key)
        if live is None or (run_id is not None and live[0] != run_id):
            return None
        run = live[0]
        th = self._thread(t, key)
        if clear:
            self._remove(t, th, t.rows(key, th.pending, 0), "cancelled", run=run)
            emptied(th)
        _abort_run(th, key, run, reason, outbox)
        t.save_thread(th)
        return run


def _abort_run(th: ThreadRow, key: str, run: str, reason: str, outbox: Outbox) -> None:
    """Mark ``run`` aborted on its thread and tell its runtime (``abort`` and an interrupting
    ``route``)."""
    th.abort = run
    outbox.add(run_runtime(run), Notice("abort", key, run, reason))
