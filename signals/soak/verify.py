"""The soak's verdict: the figures, computed from the agents' records and the receipts.

* **lost**: accepted signals (``send`` returned, not a duplicate; or a send that failed but
  whose retry came back as a duplicate, so it was stored) that did not end ``processed``, or
  whose ``processed`` receipt names a run that never recorded the work. Must be 0.
* **duplicates**: signals the agents recorded processing more than once (at-least-once:
  allowed, counted).
* **overlaps**: pairs of runs of one thread whose recorded intervals intersect. A run's
  interval runs from its ``start`` record (written before the agent does anything) to its
  ``end`` record or, for a run killed before it could write one, to the moment the soak
  reaped its process: it contains everything the agent did. Must be 0.
* **token violations**: fenced writes accepted with a lower token than an earlier accepted
  write of the thread (read back from the fence logs, in acceptance order), plus runs whose
  token is not greater than that of a run of the thread that started earlier (the lease's
  fencing counter went back, or a run started after a later grant). Must be 0.
* **fence refusals**: fenced writes refused because a higher token had written first: a
  stale owner stopped by fencing. Counted.
* **takeover**: for each SIGKILL, each thread on which the victim had a signal in hand (a
  ``got`` record of a run with no ``end``, and no ``sig`` for that signal): the time from the
  kill to the first run of that thread by another worker. Such a thread with no later run
  counts as not taken over (its signal is then lost as well).
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from signals.soak.record import read_fence_logs, read_records
from signals.soak.run import describe

if TYPE_CHECKING:
    from signals.soak.run import Facts

__all__ = ["format_report", "summary_line", "verify"]

_EXAMPLES = 5


@dataclass
class _Run:
    run: str
    thread: str
    runtime: str
    pid: int
    token: int | None
    start: float
    end: float
    open: bool
    how: str | None  # how the agent exited (``None``: killed before it could say)


def _percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile (``None`` for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def _runs(records: list[dict[str, Any]], facts: Facts) -> dict[str, _Run]:
    exits: dict[int, float] = {}
    if facts.fleet is not None:
        exits = {e.pid: e.at for e in facts.fleet.exits}
    ends = {r["run"]: r["t"] for r in records if r.get("k") == "end"}
    hows = {r["run"]: r.get("how") for r in records if r.get("k") == "end"}
    runs: dict[str, _Run] = {}
    for r in records:
        if r.get("k") != "start":
            continue
        end = ends.get(r["run"])
        runs[r["run"]] = _Run(
            run=r["run"], thread=r["th"], runtime=r["rt"], pid=r["pid"], token=r["tok"],
            start=r["t"], end=end if end is not None else exits.get(r["pid"], facts.ended_at),
            open=end is None, how=hows.get(r["run"]),
        )
    return runs


def _stranded(facts: Facts, by_thread: dict[str, list[_Run]]) -> list[str]:
    """The threads still holding unfinished signals after the drain, with no owner, whose last
    run was killed by the soak or cancelled (its lease lost): nobody took them over."""
    killed = {k.pid for k in facts.fleet.kills} if facts.fleet is not None else set()
    out = []
    for thread, seen in sorted(facts.stuck.items()):
        if "error" in seen or seen.get("owner_now") is not None:
            continue
        runs = by_thread.get(thread, [])
        last = max(runs, key=lambda r: r.start) if runs else None
        # The stream's last run may be one whose agent never started (killed right after its
        # claim): then the stream says whose it was.
        if seen.get("last_owner_killed") or (last is not None and (
            last.how == "cancelled" or (last.open and last.pid in killed)
        )):
            out.append(thread)
    return out


def verify(facts: Facts) -> dict[str, Any]:
    """Every figure of the run, as a JSON-ready dict (``ok`` is the verdict)."""
    records = read_records(facts.workdir / "records")
    fence_logs = read_fence_logs(facts.workdir / "records" / "fence")
    runs = _runs(records, facts)
    by_thread: dict[str, list[_Run]] = defaultdict(list)
    for run in runs.values():
        by_thread[run.thread].append(run)

    overlaps: list[dict[str, Any]] = []
    regressions: list[dict[str, Any]] = []
    for thread, thread_runs in by_thread.items():
        thread_runs.sort(key=lambda r: r.start)
        latest: _Run | None = None  # the run that ends last among those started so far
        top: _Run | None = None  # the run with the highest token among those started so far
        for run in thread_runs:
            if latest is not None and run.start < latest.end:
                overlaps.append({"thread": thread, "first": latest.run, "second": run.run,
                                 "seconds": round(latest.end - run.start, 6),
                                 "first_open": latest.open})
            if latest is None or run.end > latest.end:
                latest = run
            if (run.token is not None and top is not None and top.token is not None
                    and run.token <= top.token):
                regressions.append({"thread": thread, "earlier": top.run,
                                    "earlier_token": top.token, "later": run.run,
                                    "later_token": run.token})
            if run.token is not None and (top is None or top.token is None
                                          or run.token > top.token):
                top = run

    out_of_order = 0
    for entries in fence_logs.values():
        for (_, before), (_, after) in itertools.pairwise(entries):
            out_of_order += after < before

    sigs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if r.get("k") == "sig":
            sigs[r["id"]].append(r)
    refused = sum(not ok for r in records if r.get("k") == "sig" for ok in r["fence"])
    accepted_writes = sum(len(entries) for entries in fence_logs.values())

    s = facts.sends
    checked = dict(s.accepted)
    checked.update({sid: th for sid, th in s.unconfirmed.items()
                    if facts.receipts.get(sid) is not None})
    lost_detail: dict[str, int] = defaultdict(int)
    lost_ids: list[str] = []
    processed = 0
    for sid in sorted(checked):
        receipt = facts.receipts.get(sid)
        if receipt is not None and receipt.status == "processed":
            processed += 1
            if any(r["run"] == receipt.run_id for r in sigs.get(sid, ())):
                continue
            reason = "acked_without_record"
        else:
            reason = "missing_receipt" if receipt is None else receipt.status
        lost_detail[reason] += 1
        lost_ids.append(sid)
    duplicates = {sid: len(rs) for sid, rs in sigs.items() if len(rs) > 1}
    waits = sorted(
        (max(0.0, min(r["e"] for r in sigs[sid]) - at), sid)
        for sid, at in s.accepted_at.items() if sid in sigs
    )

    # Takeover: the threads a killed worker had a signal in hand on (handed to the agent,
    # not yet recorded done): that signal must be redelivered, so another worker must run the
    # thread; the time to its first run there.
    in_hand: dict[str, set[str]] = defaultdict(set)
    for r in records:
        if r.get("k") == "got":
            in_hand[r["run"]].add(r["id"])
    for r in records:
        if r.get("k") == "sig":
            in_hand[r["run"]].discard(r["id"])
    latencies: list[float] = []
    untaken: list[dict[str, Any]] = []
    fleet = facts.fleet
    for kill in fleet.kills if fleet is not None else ():
        victims = {r.thread for r in runs.values()
                   if r.pid == kill.pid and r.open and in_hand.get(r.run)}
        for thread in sorted(victims):
            next_runs = [r.start for r in by_thread[thread]
                         if r.start > kill.at and r.pid != kill.pid]
            if next_runs:
                latencies.append(min(next_runs) - kill.at)
            else:
                untaken.append({"thread": thread, "killed_pid": kill.pid})

    token_violations = out_of_order + len(regressions)
    lost = len(lost_ids)
    crashes = [e for e in fleet.exits if e.cause == "crashed"] if fleet is not None else []

    def seconds(value: float | None) -> float | None:
        return None if value is None else round(value, 3)

    result: dict[str, Any] = {
        "ok": lost == 0 and not overlaps and token_violations == 0 and len(checked) > 0,
        "settings": describe(facts),
        "faults": {
            "kills": len(fleet.kills) if fleet is not None else 0,
            "redis_restarts": len(facts.restarts),
            "redis_down_seconds": [round(d, 3) for _, d in facts.restarts],
            "blackholes": len(facts.holes),
            "blackhole_slots": [slot for slot, _, _ in facts.holes],
            "worker_crashes": len(crashes),
            "workers_started": sum(sl.starts for sl in fleet.slots) if fleet is not None else 0,
            "workers_hung_at_stop": facts.hung_at_stop,
            "worker_start_to_ready_s": {
                "p50": seconds(_percentile(fleet.startup_s, 50)) if fleet else None,
                "max": seconds(max(fleet.startup_s, default=None)) if fleet else None,
            },
        },
        "signals": {
            "sent": s.sent,
            "conversations": s.conversations,
            "accepted": len(s.accepted) - len(s.after_retry),
            "accepted_after_failed_send": len(s.after_retry),
            "never_confirmed": len(s.unconfirmed),
            "checked": len(checked),
            "repeats_sent": s.resends,
            "repeats_refused_as_duplicate": s.resends_refused,
            "dedup_failures": s.dedup_failures,
            "new_ids_reported_duplicate": s.unexpected_duplicates,
            "send_errors": dict(s.errors),
            "unexpected_send_errors": dict(s.unexpected_errors),
        },
        "processed": processed,
        "lost": lost,
        "lost_detail": dict(lost_detail),
        "lost_ids": lost_ids[:20],
        "lost_threads": sorted({checked[sid] for sid in lost_ids}),
        "stuck_threads": facts.stuck,
        "stranded": _stranded(facts, by_thread),
        "duplicates": len(duplicates),
        "duplicate_extra_processings": sum(n - 1 for n in duplicates.values()),
        "max_attempt": max((r["att"] for rs in sigs.values() for r in rs), default=0),
        "runs": len(runs),
        "runs_without_end_record": sum(r.open for r in runs.values()),
        "overlaps": len(overlaps),
        "overlap_examples": overlaps[:_EXAMPLES],
        "token_violations": token_violations,
        "token_violation_detail": {"fenced_writes_out_of_order": out_of_order,
                                   "run_token_regressions": len(regressions)},
        "token_regression_examples": regressions[:_EXAMPLES],
        "fenced_writes_accepted": accepted_writes,
        "fence_refusals": refused,
        "takeover_s": {
            "count": len(latencies), "p50": seconds(_percentile(latencies, 50)),
            "p99": seconds(_percentile(latencies, 99)),
            "max": seconds(max(latencies, default=None)),
            "not_taken_over": len(untaken),
            "not_taken_over_threads": sorted({u["thread"] for u in untaken}),
        },
        "processing_latency_s": {
            "p50": seconds(_percentile([w for w, _ in waits], 50)),
            "p99": seconds(_percentile([w for w, _ in waits], 99)),
            "max": seconds(waits[-1][0] if waits else None),
            "slowest": [{"id": sid, "thread": checked.get(sid), "seconds": round(w, 3)}
                        for w, sid in waits[-_EXAMPLES:][::-1]],
        },
        "fault_phase_seconds": round(facts.fault_s, 1),
        "drain_seconds": round(facts.drain_s, 1),
    }
    return result


def _t(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def format_report(result: dict[str, Any]) -> str:
    """The human-readable report (without the summary line)."""
    st, f, sg = result["settings"], result["faults"], result["signals"]
    tk, lat = result["takeover_s"], result["processing_latency_s"]
    every = {k: st[k] for k in ("kill_every", "restart_redis_every", "blackhole_every")}
    lines = [
        f"signals.soak: backend {st['backend']}; {st['redis'] or 'no Redis'}; "
        f"{st['workers']} workers, {st['threads']} threads, {st['seconds']:g} s, "
        f"ttl {st['ttl_ms']} ms, {st['rate']:g} signals/s, seed {st['seed']}",
        f"  faults      {f['kills']} kills (every {every['kill_every'] or '-'} s), "
        f"{f['redis_restarts']} server restarts (every {every['restart_redis_every'] or '-'} s), "
        f"{f['blackholes']} black holes ({st['blackhole_seconds'] or '-'} s every "
        f"{every['blackhole_every'] or '-'} s); {f['workers_started']} worker processes "
        f"(ready after p50 {_t(f['worker_start_to_ready_s']['p50'])}), "
        f"{f['worker_crashes']} crashed by themselves",
        f"  sent        {sg['sent']} new signals ({sg['conversations']} short conversations "
        f"among them): {sg['accepted']} accepted"
        f" + {sg['accepted_after_failed_send']} accepted by a send that failed (its retry"
        f" said duplicate), {sg['never_confirmed']} never confirmed; send errors "
        f"{sum(sg['send_errors'].values())}; repeats refused as duplicates "
        f"{sg['repeats_refused_as_duplicate']}/{sg['repeats_sent']}",
        f"  processed   {result['processed']} of {sg['checked']} (receipt processed)",
        f"  lost        {result['lost']}"
        + (f"  {result['lost_detail']} e.g. {result['lost_ids'][:5]} on threads "
           f"{result['lost_threads'][:10]}; stranded (last owner killed or lost its lease, "
           f"nobody took over): {result['stranded'][:10]}" if result["lost"] else ""),
        f"  duplicates  {result['duplicates']} signals processed more than once "
        f"({result['duplicate_extra_processings']} extra; at-least-once allows it); "
        f"highest attempt {result['max_attempt']}",
        f"  runs        {result['runs']} ({result['runs_without_end_record']} ended by a kill); "
        f"overlapping runs {result['overlaps']}",
        f"  fencing     {result['fenced_writes_accepted']} fenced writes accepted, "
        f"{result['fence_refusals']} refused; token violations {result['token_violations']} "
        f"{result['token_violation_detail']}",
        f"  takeover    {tk['count']} threads after {f['kills']} kills: p50 {_t(tk['p50'])}, "
        f"p99 {_t(tk['p99'])}, max {_t(tk['max'])}; not taken over {tk['not_taken_over']}",
        f"  latency     send returned -> first processing: p50 {_t(lat['p50'])}, p99 "
        f"{_t(lat['p99'])}, max {_t(lat['max'])}",
        f"  timing      faults {result['fault_phase_seconds']} s, drain "
        f"{result['drain_seconds']} s; key prefix {st['key_prefix']}; records in "
        f"{st['records']}",
    ]
    if sg["unexpected_send_errors"] or sg["dedup_failures"] or sg["new_ids_reported_duplicate"]:
        lines.append(f"  anomalies   unexpected send errors {sg['unexpected_send_errors']}, "
                     f"dedup failures {sg['dedup_failures']}, new ids reported duplicate "
                     f"{sg['new_ids_reported_duplicate']}")
    for example in result["overlap_examples"]:
        lines.append(f"  overlap     {example}")
    for example in result["token_regression_examples"]:
        lines.append(f"  token       {example}")
    return "\n".join(lines)


def summary_line(result: dict[str, Any]) -> str:
    """The one-line summary printed last."""
    tk = result["takeover_s"]
    f = result["faults"]
    verdict = "PASSED" if result["ok"] else "FAILED"
    return (
        f"soak {verdict}: accepted {result['signals']['checked']}, processed "
        f"{result['processed']}, lost {result['lost']}, duplicates {result['duplicates']}, "
        f"overlaps {result['overlaps']}, token violations {result['token_violations']}, "
        f"kills {f['kills']}, server restarts {f['redis_restarts']}, black holes "
        f"{f['blackholes']}, takeover p50 {_t(tk['p50'])} p99 {_t(tk['p99'])}"
    )
