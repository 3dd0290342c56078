"""Checking a scenario's expectations against what its run produced."""

from __future__ import annotations

__all__ = ["Check", "check_run"]

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pipecat_actions.ledger import Operation, OperationEvent
from pipecat_actions.ledger.records import EventKind, may_be_owed
from pipecat_actions.scenarios.loader import LoadedScenario
from pipecat_actions.scenarios.model import (
    EventExpectation,
    Expectations,
    OperationExpectation,
    OrderItem,
    TextExpectation,
)
from pipecat_actions.scenarios.runner import Run
from pipecat_actions.scenarios.timeline import told_outcomes
from pipecat_actions.status import TERMINAL_STATUSES, ActionStatus

S = ActionStatus


@dataclass(frozen=True)
class Check:
    """One expectation, checked.

    Attributes:
        what: The expectation, in words.
        passed: Whether it holds.
        found: What the run showed, when it does not hold (or always, briefly).
    """

    what: str
    passed: bool
    found: str = ""


def check_run(loaded: LoadedScenario, run: Run) -> list[Check]:
    """Check every expectation of ``loaded`` against ``run``, in the file's order."""
    expect = loaded.spec.expect
    checks: list[Check] = []
    if run.error is not None:
        checks.append(Check("the steps run to the end", False, run.error))
    if run.unresolved:  # the call was sent with a null: not the story the file tells
        checks.append(
            Check("every argument read from an earlier answer found it", False, run.unresolved[0])
        )
    for expectation in expect.operations:
        checks.extend(_operation_checks(expectation, run))
    checks.extend(_totals(expect, run))
    checks.extend(_text_checks("heard", [_heard_text(u) for u in run.heard], expect.heard))
    if expect.heard.complete:
        complete = [u.text for u in run.heard if not u.interrupted]
        for phrase in expect.heard.includes:
            found = any(phrase.lower() in text.lower() for text in complete)
            checks.append(Check(f"heard {phrase!r} to the end", found, _quote(complete)))
    context = [_message_text(m) for m in run.context]
    checks.extend(_text_checks("context", context, expect.context))
    if expect.order:
        checks.append(_order_check(expect.order, run))
    if expect.script_consumed:
        checks.append(
            Check(
                "every llm step was used",
                run.script_left == 0,
                f"{run.script_left} llm step(s) never used",
            )
        )
    return checks


# --- operations ----------------------------------------------------------------------------


def _selected(expectation: OperationExpectation, run: Run) -> tuple[str, list[Operation]]:
    if expectation.op is not None:
        op_id = run.labels.get(expectation.op)
        return expectation.op, [op for op in run.operations if op.operation_id == op_id]
    ops = [
        op
        for op in run.operations
        if op.tool == expectation.tool
        and all(op.args.get(k) == v for k, v in expectation.args.items())
        and (expectation.in_status is None or op.status is expectation.in_status)
    ]
    args = f" {json.dumps(expectation.args)}" if expectation.args else ""
    status = f" {expectation.in_status}" if expectation.in_status is not None else ""
    return f"{expectation.tool}{args}{status}", ops


def _operation_checks(expectation: OperationExpectation, run: Run) -> list[Check]:
    name, ops = _selected(expectation, run)
    wanted = 1 if expectation.count is None else expectation.count
    checks = [
        Check(
            f"{name}: {wanted} operation(s)",
            len(ops) == wanted,
            ", ".join(f"{op.operation_id} {op.status}" for op in ops) or "none",
        )
    ]
    for op in ops:
        checks.extend(_one_operation(name, expectation, op, run))
    return checks


def _path(run: Run, op: Operation) -> list[ActionStatus]:
    path: list[ActionStatus] = []
    for event in run.events.get(op.operation_id, []):
        if event.to_status is not S.REQUESTED and event.to_status != event.from_status:
            path.append(event.to_status)
    return path


def _one_operation(
    name: str, expectation: OperationExpectation, op: Operation, run: Run
) -> list[Check]:
    e = expectation
    checks: list[Check] = []

    def expect(what: str, passed: bool, found: object) -> None:
        checks.append(Check(f"{name}: {what}", passed, str(found)))

    if e.status is not None:
        expect(f"status {e.status}", op.status is e.status, op.status)
    if e.path is not None:
        path = _path(run, op)
        expect(
            "path " + " -> ".join(e.path),
            path == list(e.path),
            " -> ".join(path) or "no transitions",
        )
    if e.escalated is not None:
        expect(
            "escalated" if e.escalated else "not escalated",
            (op.escalated_at is not None) == e.escalated,
            "escalated" if op.escalated_at else "not escalated",
        )
    if e.delivered is not None:
        told_it = op.delivered_at is not None or (op.kind == "read" and _told(run, op) > 0)
        expect(
            "told to the LLM" if e.delivered else "never told to the LLM",
            told_it == e.delivered,
            "told" if told_it else "not told",
        )
    if e.acknowledged is not None:
        expect(
            "heard by the user" if e.acknowledged else "not acknowledged",
            (op.acknowledged_at is not None) == e.acknowledged,
            "acknowledged" if op.acknowledged_at else "not acknowledged",
        )
    if e.attempts is not None:
        expect(f"{e.attempts} attempt(s)", op.attempt == e.attempts, op.attempt)
    if e.result is not None:
        result = op.result if isinstance(op.result, dict) else {}
        expect(
            f"result has {json.dumps(e.result)}",
            all(result.get(k) == v for k, v in e.result.items()),
            json.dumps(op.result),
        )
    if e.error_contains is not None:
        expect(
            f"error mentions {e.error_contains!r}",
            e.error_contains.lower() in (op.error or "").lower(),
            op.error,
        )
    if e.told is not None:
        told = _told(run, op)
        expect(f"told {e.told} time(s)", told == e.told, told)
    if e.events:
        trail = run.events.get(op.operation_id, [])
        position = 0
        for wanted in e.events:
            found = next(
                (i for i in range(position, len(trail)) if _event_matches(wanted, trail[i])),
                None,
            )
            expect(
                f"audit event {wanted.model_dump(mode='json', exclude_defaults=True)}"
                + (" (in order)" if position else ""),
                found is not None,
                "; ".join(_event_text(event) for event in trail[position:]) or "no events",
            )
            if found is not None:
                position = found + 1
    if e.compensated_by_committed is not None:
        linked = [o for o in run.operations if o.compensates == op.operation_id]
        done = any(o.status is S.COMMITTED for o in linked)
        expect(
            "compensated (linked operation COMMITTED)"
            if e.compensated_by_committed
            else "not compensated",
            done == e.compensated_by_committed,
            ", ".join(f"{o.operation_id} {o.status}" for o in linked) or "no compensation",
        )
    return checks


def _told(run: Run, op: Operation) -> int:
    """How many times ``op``'s outcome was told (the delivery annotations of its trail).

    A read's answer is told by the gate without a delivery in the ledger (a refusal of one
    has one): its tool results that carried a final status are counted instead.
    """
    annotated = sum(
        1
        for event in run.events.get(op.operation_id, [])
        if event.kind is EventKind.ANNOTATION and "delivered" in (event.detail or {})
    )
    if annotated or op.kind != "read":
        return annotated
    return told_outcomes(run.timeline, op.operation_id)


def _event_matches(wanted: EventExpectation, event: OperationEvent) -> bool:
    detail = event.detail or {}
    return (
        (wanted.kind is None or event.kind.value == wanted.kind)
        and (wanted.to_status is None or event.to_status is wanted.to_status)
        and (wanted.actor is None or wanted.actor.lower() in (event.actor or "").lower())
        and all(detail.get(k) == v for k, v in wanted.detail.items())
    )


def _event_text(event: OperationEvent) -> str:
    moved = f" -> {event.to_status}" if event.to_status is not None else ""
    return f"{event.kind.value}{moved} by {event.actor} {json.dumps(event.detail, default=str)}"


def _totals(expect: Expectations, run: Run) -> list[Check]:
    checks: list[Check] = []
    for target, count in expect.requests.items():
        found = run.requests.get(target, 0)
        checks.append(Check(f"{count} request(s) reached {target}", found == count, str(found)))
    if expect.undelivered is not None:
        wanted = sorted(expect.undelivered)
        untold = sorted(
            label
            for label, op_id in run.labels.items()
            for op in run.operations
            if op.operation_id == op_id
            and may_be_owed(op)
            and op.status is S.COMMITTED
            and op.delivered_at is None
        )
        checks.append(
            Check(
                f"committed and never told: {', '.join(wanted) or 'none'}",
                untold == wanted,
                ", ".join(untold) or "none",
            )
        )
    session_ops = [op for op in run.operations if op.compensates is None]
    if expect.operation_count is not None:
        checks.append(
            Check(
                f"{expect.operation_count} operation(s) in the ledger",
                len(session_ops) == expect.operation_count,
                ", ".join(f"{op.tool} {op.status}" for op in session_ops),
            )
        )
    for kind, count in expect.side_effects.items():
        found = run.side_effects.get(kind, 0)
        checks.append(Check(f"{count} {kind} side effect(s)", found == count, str(found)))
    if expect.max_effects_per_key is not None:
        worst = max(run.effects_by_key.values(), default=0)
        checks.append(
            Check(
                f"at most {expect.max_effects_per_key} side effect(s) per idempotency key",
                worst <= expect.max_effects_per_key,
                f"{worst} for one key",
            )
        )
    if expect.settled:
        open_ops = [
            op
            for op in run.operations
            if op.status not in TERMINAL_STATUSES and op.escalated_at is None
        ]
        checks.append(
            Check(
                "nothing left in flight",
                not open_ops,
                ", ".join(f"{op.operation_id} {op.tool} {op.status}" for op in open_ops),
            )
        )
    return checks


# --- text and order ------------------------------------------------------------------------


def _heard_text(utterance: Any) -> str:
    return str(utterance.text)


def _message_text(message: Any) -> str:
    return json.dumps(message, default=str)


def _quote(texts: Iterable[str]) -> str:
    return " | ".join(texts) or "nothing"


def _text_checks(where: str, texts: list[str], expectation: TextExpectation) -> list[Check]:
    checks: list[Check] = []
    lowered = [t.lower() for t in texts]
    position = 0
    for phrase in expectation.includes:
        index = next(
            (i for i in range(position, len(lowered)) if phrase.lower() in lowered[i]), None
        )
        checks.append(
            Check(
                f"{where} includes {phrase!r}" + (" (in order)" if position else ""),
                index is not None,
                _quote(texts) if index is None else "",
            )
        )
        if index is not None:
            position = index
    for phrase in expectation.excludes:
        hits = [t for t in texts if phrase.lower() in t.lower()]
        checks.append(Check(f"{where} never has {phrase!r}", not hits, _quote(hits)))
    return checks


def _order_check(items: list[OrderItem], run: Run) -> Check:
    what = " < ".join(_item_name(item) for item in items)
    after = float("-inf")
    for item in items:
        at = _first_time(item, run, after)
        if at is None:
            return Check(
                f"in order: {what}",
                False,
                f"{_item_name(item)} did not happen after the one before",
            )
        after = at
    return Check(f"in order: {what}", True)


def _item_name(item: OrderItem) -> str:
    if item.op is not None:
        return f"{item.op} {item.status}"
    if item.delivered is not None:
        return f"{item.delivered} told"
    return f"heard {item.heard!r}"


def _first_time(item: OrderItem, run: Run, after: float) -> float | None:
    if item.heard is not None:
        phrase = item.heard.lower()
        times = [u.started_monotonic for u in run.heard if phrase in u.text.lower()]
    else:
        label = item.op or item.delivered
        op_id = run.labels.get(label or "")
        times = [
            entry.at
            for entry in run.timeline
            if entry.operation_id == op_id
            and op_id is not None
            and (entry.delivered if item.delivered else entry.status is item.status)
        ]
    later = [t for t in times if t >= after]
    return min(later) if later else None
