"""Who may decide on a request is policy, and the requester never decides on their own.

The rule is recorded when the request is made, so the same check holds in the runtime that
asked, in another runtime, and in a process that only has the ledger (the CLI, the console).
"""

from __future__ import annotations

import json

import pytest

from pipecat_actions.approvals import (
    ApprovalRefused,
    ApprovalRule,
    Approver,
    approval_rule,
    approve_operation,
    reject_operation,
)
from pipecat_actions.clock import ManualClock
from pipecat_actions.ledger import SqlLedger
from pipecat_actions.ledger.records import EventKind
from pipecat_actions.policy import PolicyError, load_policy_text
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.session import SessionState
from pipecat_actions.status import ActionStatus

from .._waiting import eventually
from ._admission_support import Restaurant, booking_args, running

S = ActionStatus

POLICY = """
  book_table:
    kind: mutation
    risk: high
    confirmation:
      mode: approval
      approvers: [Rosa, alice]
      approver_roles: [manager]
      expires_after_secs: 300
"""

ALICE = SessionState("call-1", principal="alice")
HERE = frozenset({"default"})
"""The tenant of the sessions here (`SessionState`'s default): the approvers' own."""


async def _ask(rt: ActionRuntime, session: SessionState = ALICE) -> str:
    asked = await rt.propose("book_table", booking_args(party_size=4), session)
    assert asked["status"] == "awaiting_approval", asked
    return str(asked["operation_id"])


async def _args_hash(rt: ActionRuntime, operation_id: str) -> str:
    return (await rt.ledger.get(operation_id)).args_hash


async def test_the_request_records_who_may_decide_and_the_risk(
    ledger_url: str, clock: ManualClock
) -> None:
    async with running(POLICY, Restaurant(clock), ledger_url=ledger_url, clock=clock) as rt:
        op_id = await _ask(rt)
        rule = await approval_rule(rt.ledger, op_id)
    assert rule == ApprovalRule(
        approvers=("Rosa", "alice"),
        roles=("manager",),
        risk="high",
        description="Book a table and return the booking reference.",
    )


@pytest.mark.parametrize(
    "who",
    [
        Approver("rosa", tenants=HERE),
        Approver("ROSA", tenants=HERE),
        Approver("sam", frozenset({"manager", "x"}), HERE),
    ],
    ids=["named", "named-any-case", "by-role"],
)
async def test_a_named_approver_or_a_member_of_a_role_approves_and_is_recorded(
    ledger_url: str, clock: ManualClock, who: Approver
) -> None:
    restaurant = Restaurant(clock)
    async with running(POLICY, restaurant, ledger_url=ledger_url, clock=clock) as rt:
        op_id = await _ask(rt)
        approved = await rt.approve(
            op_id, approver=who, reason="  regular guest ", args_hash=await _args_hash(rt, op_id)
        )
        done = await rt.wait(op_id)
        trail = await rt.ledger.events(op_id)
    assert approved.status is S.ADMITTED
    assert done.status is S.COMMITTED
    decision = next(e for e in trail if e.to_status is S.ADMITTED)
    assert decision.actor == f"approver:{who.name}"
    assert decision.detail["reason"] == "regular guest"
    assert decision.detail["approver"] == who.name
    assert decision.detail.get("as_role") == (["manager"] if who.roles else None)


@pytest.mark.parametrize(
    ("who", "reason", "refusal"),
    [
        (Approver("alice", tenants=HERE), "fine", "a requester never decides on their own request"),
        (Approver("ALICE", frozenset({"manager"}), HERE), "fine", "their own request"),
        (Approver("mallory", tenants=HERE), "fine", "mallory may not approve book_table"),
        (Approver("sam", frozenset({"cook"}), HERE), "fine", "Rosa, alice or role manager"),
        (Approver("", tenants=HERE), "fine", "needs the approver's name"),
        (Approver("   ", tenants=HERE), "fine", "needs the approver's name"),
        (Approver("rosa\x1b[2J", tenants=HERE), "fine", "not an approver name"),
        (Approver("rosa", tenants=HERE), "", "needs a reason"),
        (Approver("rosa", tenants=HERE), "  \n", "needs a reason"),
        (Approver("rosa", tenants=HERE), "\u200b\u202e\x1b", "needs a reason"),
        (Approver("rosa", tenants=HERE), "\u2800\u3164\u00a0", "needs a reason"),
    ],
    ids=[
        "requester",
        "requester-any-case-with-a-role",
        "not-named",
        "wrong-role",
        "blank",
        "spaces",
        "control-characters",
        "no-reason",
        "blank-reason",
        "invisible-reason",
        "blank-looking-reason",
    ],
)
async def test_a_decision_by_someone_the_rule_does_not_allow_is_refused_and_changes_nothing(
    ledger_url: str, clock: ManualClock, who: Approver, reason: str, refusal: str
) -> None:
    restaurant = Restaurant(clock)
    async with running(POLICY, restaurant, ledger_url=ledger_url, clock=clock) as rt:
        op_id = await _ask(rt)
        args_hash = await _args_hash(rt, op_id)
        with pytest.raises(ApprovalRefused, match=refusal):
            await rt.approve(op_id, approver=who, reason=reason, args_hash=args_hash)
        with pytest.raises(
            ApprovalRefused, match=refusal.replace("may not approve", "may not reject")
        ):
            await rt.reject(op_id, approver=who, reason=reason)
        after = await rt.ledger.get(op_id)
        trail = await rt.ledger.events(op_id)
    assert after.status is S.AWAITING_APPROVAL
    # Nothing changed but the record of who tried and why it was refused; a name that names
    # nobody leaves no record of a person.
    assert not [e for e in trail if e.kind is EventKind.TRANSITION]
    notes = [e.detail for e in trail if e.kind is EventKind.ANNOTATION]
    if "approver's name" in refusal or "not an approver name" in refusal:
        assert notes == []
    else:
        assert [n["decision_refused"] for n in notes] == ["approve", "reject"]
        assert {n["approver"] for n in notes} == {who.name}
        assert refusal in notes[0]["reason"]
    assert restaurant.bookings_made == 0


async def test_an_approval_must_name_the_arguments_it_approves(
    ledger_url: str, clock: ManualClock
) -> None:
    async with running(POLICY, Restaurant(clock), ledger_url=ledger_url, clock=clock) as rt:
        op_id = await _ask(rt)
        with pytest.raises(ApprovalRefused, match="names the arguments it approves"):
            await rt.approve(
                op_id, approver=Approver("rosa", tenants=HERE), reason="ok", args_hash=""
            )
        assert (await rt.ledger.get(op_id)).status is S.AWAITING_APPROVAL


async def test_the_rules_hold_in_a_process_that_has_only_the_ledger(
    ledger_url: str, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    async with running(POLICY, restaurant, ledger_url=ledger_url, clock=clock) as rt:
        op_id = await _ask(rt)
        async with await SqlLedger.create(ledger_url, clock=clock) as ledger:
            op = await ledger.get(op_id)
            with pytest.raises(ApprovalRefused, match="their own request"):
                await approve_operation(
                    ledger,
                    op_id,
                    approver=Approver("alice", tenants=HERE),
                    reason="mine",
                    now=clock.now(),
                    args_hash=op.args_hash,
                )
            with pytest.raises(ApprovalRefused, match="may not reject"):
                await reject_operation(
                    ledger,
                    op_id,
                    approver=Approver("bob", tenants=HERE),
                    reason="no",
                    now=clock.now(),
                )
            rejected = await reject_operation(
                ledger,
                op_id,
                approver=Approver("sam", frozenset({"manager"}), HERE),
                reason="full",
                now=clock.now(),
            )
    assert rejected.status is S.REJECTED
    assert rejected.error == "rejected by sam: full"
    assert restaurant.bookings_made == 0


async def test_an_expired_request_cannot_be_approved_even_by_an_approver(
    ledger_url: str, clock: ManualClock
) -> None:
    async with running(POLICY, Restaurant(clock), ledger_url=ledger_url, clock=clock) as rt:
        op_id = await _ask(rt)
        args_hash = await _args_hash(rt, op_id)
        clock.advance(301)
        with pytest.raises(ApprovalRefused, match=r"expired|EXPIRED"):
            await rt.approve(
                op_id, approver=Approver("rosa", tenants=HERE), reason="late", args_hash=args_hash
            )
        assert (await rt.ledger.get(op_id)).status is S.EXPIRED


async def test_a_rejection_after_the_window_closed_records_that_it_expired(
    ledger_url: str, clock: ManualClock
) -> None:
    async with running(POLICY, Restaurant(clock), ledger_url=ledger_url, clock=clock) as rt:
        op_id = await _ask(rt)
        clock.advance(301)
        with pytest.raises(ApprovalRefused, match="expired before this rejection"):
            await rt.reject(
                op_id, approver=Approver("rosa", tenants=HERE), reason="too late anyway"
            )
        op = await rt.ledger.get(op_id)
        assert op.status is S.EXPIRED
        assert [e.to_status for e in await rt.ledger.events(op_id)][-1] is S.EXPIRED


async def test_roles_are_matched_without_regard_to_case_as_names_are(
    ledger_url: str, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    async with running(POLICY, restaurant, ledger_url=ledger_url, clock=clock) as rt:
        op_id = await _ask(rt)
        args_hash = await _args_hash(rt, op_id)
        approved = await rt.approve(
            op_id,
            approver=Approver("sam", frozenset({"Manager"}), HERE),
            reason="ok",
            args_hash=args_hash,
        )
        assert approved.status is S.ADMITTED
        (decided,) = [e for e in await rt.ledger.events(op_id) if e.to_status is S.ADMITTED]
        assert decided.detail["as_role"] == ["manager"]


async def test_an_expired_request_expires_whatever_the_refused_decision_got_wrong(
    ledger_url: str, clock: ManualClock
) -> None:
    async with running(POLICY, Restaurant(clock), ledger_url=ledger_url, clock=clock) as rt:
        op_id = await _ask(rt)
        clock.advance(301)
        with pytest.raises(ApprovalRefused, match="expired before this approval"):
            await rt.approve(
                op_id, approver=Approver("bob", tenants=HERE), reason="", args_hash="0" * 64
            )
        assert (await rt.ledger.get(op_id)).status is S.EXPIRED


@pytest.mark.parametrize("decide", ["approve", "reject"])
async def test_a_decision_after_the_runtime_expired_the_request_is_told_it_expired(
    ledger_url: str, clock: ManualClock, decide: str
) -> None:
    async with running(POLICY, Restaurant(clock), ledger_url=ledger_url, clock=clock) as rt:
        op_id = await _ask(rt)
        args_hash = await _args_hash(rt, op_id)
        clock.advance(301)

        async def expired() -> bool:
            return (await rt.ledger.get(op_id)).status is S.EXPIRED

        await eventually(expired, what="the runtime's own expiry of the request")
        decision = (
            rt.approve(
                op_id, approver=Approver("bob", tenants=HERE), reason="ok", args_hash=args_hash
            )
            if decide == "approve"
            else rt.reject(op_id, approver=Approver("bob", tenants=HERE), reason="no")
        )
        with pytest.raises(ApprovalRefused, match=r"expired before this (approval|rejection)"):
            await decision
        assert (await rt.ledger.get(op_id)).status is S.EXPIRED


@pytest.mark.parametrize(
    "principal",
    [
        "rosa ",
        " ROSA",
        "ro\u200bsa",
        "\uff52osa",  # fullwidth r
        "r\u043esa",  # Cyrillic o
        "r\u043e\u0455\u0430",  # Cyrillic o, dze and a: one Latin letter left
        "R\u039fSA",  # Greek capital omicron
        "ros\u03b1",  # Greek alpha
        "ro\u034fsa",  # combining grapheme joiner: a mark that shows nothing
    ],
)
async def test_a_requester_written_another_way_still_never_decides(
    ledger_url: str, clock: ManualClock, principal: str
) -> None:
    async with running(POLICY, Restaurant(clock), ledger_url=ledger_url, clock=clock) as rt:
        op_id = await _ask(rt, SessionState("call-9", principal=principal))
        args_hash = await _args_hash(rt, op_id)
        with pytest.raises(ApprovalRefused, match="their own request"):
            await rt.approve(
                op_id, approver=Approver("rosa", tenants=HERE), reason="mine", args_hash=args_hash
            )


def test_a_policy_asking_for_approval_must_say_who_approves() -> None:
    # Version 2 refuses it; a version 1 file loads, warned (tests/policy/test_upgrades.py).
    with pytest.raises(PolicyError, match=r"confirmation\.approvers.*approval needs someone"):
        load_policy_text(
            "version: 2\ntools:\n  refund:\n    kind: mutation\n"
            "    confirmation: {mode: approval}\n"
        )


def test_approvers_without_approval_are_a_mistake() -> None:
    with pytest.raises(PolicyError, match=r"need confirmation\.mode: approval"):
        load_policy_text(
            "version: 1\ntools:\n  refund:\n    kind: mutation\n"
            "    confirmation: {mode: verbal, approver_roles: [manager]}\n"
        )


@pytest.mark.parametrize("name", ["", " rosa", "ro sa", "[/x]", "rosa\u202e", "x" * 129])
def test_an_approver_name_that_could_hide_another_is_refused_in_a_policy(name: str) -> None:
    with pytest.raises(PolicyError, match="not an approver name"):
        load_policy_text(
            "version: 1\ntools:\n  refund:\n    kind: mutation\n"
            f"    confirmation: {{mode: approval, approvers: [{json.dumps(name)}]}}\n"
        )


async def test_a_waiting_operation_whose_creation_recorded_nothing_has_no_rule(
    ledger_url: str, clock: ManualClock
) -> None:
    from pipecat_actions.ledger import NewOperation

    async with await SqlLedger.create(ledger_url, clock=clock) as ledger:
        op = (
            await ledger.admit(
                NewOperation(
                    tool="refund",
                    kind="mutation",
                    args={"amount": 1},
                    idempotency_key="k",
                    session_id="s",
                    principal="alice",
                    status=S.AWAITING_APPROVAL,
                )
            )
        ).operation
        assert await approval_rule(ledger, op.operation_id) is None
        with pytest.raises(ApprovalRefused, match="records nobody who may approve it"):
            await reject_operation(
                ledger,
                op.operation_id,
                approver=Approver("rosa", tenants=HERE),
                reason="no",
                now=clock.now(),
            )
