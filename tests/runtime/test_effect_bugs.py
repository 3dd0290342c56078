"""A bug in an effect is logged with its traceback, and the model is told what really comes next.

An exception an effect raises that it did not classify (a ``NameError``: a plain bug) makes a
mutation UNKNOWN: it may have been sent. It used to be logged nowhere, and the model heard "it
is being checked with the system" although the tool had no reconcile hook, so nothing would
check it: the operation is escalated for a person. What the model is told now matches what the
runtime does next, for every combination: a hook checks it ("being checked with the system"),
or a person does (no hook, or the hook gave up and the operation was escalated).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pipecat.frames.frames import LLMRunFrame

from pipecat_actions import ActionContext, Reconciliation, action
from pipecat_actions.actions import Binding
from pipecat_actions.results import reconcilable, render_operation
from pipecat_actions.testing import Say, ToolCalls
from pipecat_actions.testing.logs import capture_logs
from tests.runtime._execution_support import S as Status
from tests.runtime._execution_support import (
    booking,
    new_session,
    only_operation,
    running,
    tool_results,
)
from tests.runtime.test_pipeline import Conversation

POLICY = """
    version: 1
    tools:
      book_table:
        kind: mutation
"""

CHECKED = "being checked with the system"
BY_A_PERSON = "a person will check it"


def buggy_booking(*, reconcile: Any = None) -> Any:
    @action(reconcile=reconcile)
    async def book_table(
        ctx: ActionContext, restaurant_id: str, date: str, time: str, party_size: int
    ) -> dict[str, Any]:
        """Book a table."""
        return {"booking_id": booking_reference}  # noqa: F821

    return book_table


async def test_a_bug_in_an_effect_is_logged_with_its_traceback_and_a_person_is_said_to_check(
    ledger_url: str,
) -> None:
    async with running(POLICY, [buggy_booking()], ledger_url=ledger_url) as runtime:
        talk = Conversation(
            runtime,
            new_session(),
            [ToolCalls([("book_table", booking())]), Say("I will let you know.")],
        )
        with capture_logs("ERROR") as lines:
            messages = await talk.run([LLMRunFrame(), talk.told("call_1", "unknown")])
        op = await only_operation(runtime)

    logged = [line for line in lines if op.operation_id in line and "NameError" in line]
    assert len(logged) == 1, lines
    assert "Traceback (most recent call last)" in logged[0]
    assert "booking_reference" in logged[0]  # the line of the effect that failed
    assert "book_table" in logged[0]
    assert op.status is Status.UNKNOWN
    assert op.escalated_at is not None  # no reconcile hook: a person must look
    told = tool_results(messages)["call_1"]
    assert told["status"] == "unknown"
    assert BY_A_PERSON in told["message"]
    assert CHECKED not in told["message"]
    assert "not yet known" in told["message"]


async def test_every_unknown_says_who_checks_it_hook_or_person(ledger_url: str) -> None:
    async def still_pending(ctx: ActionContext) -> Reconciliation:
        return Reconciliation.pending()

    async with running(POLICY, [buggy_booking()], ledger_url=ledger_url) as without_hook:
        told = await without_hook.propose("book_table", booking(), new_session())
        escalated = await only_operation(without_hook)
        bindings_without = dict(without_hook.bindings)
    assert BY_A_PERSON in told["message"]
    entry = bindings_without["book_table"].policy
    bindings_with = {"book_table": Binding(buggy_booking(reconcile=still_pending), entry)}

    # The same UNKNOWN record, before and after its escalation, for each kind of tool.
    before = dataclasses.replace(escalated, escalated_at=None)
    hook, no_hook = (reconcilable(b, "book_table") for b in (bindings_with, bindings_without))
    assert (hook, no_hook) == (True, False)
    said = {
        (has_hook, escalated_yet): render_operation(
            escalated if escalated_yet else before, reconcilable=has_hook
        )["message"]
        for has_hook in (True, False)
        for escalated_yet in (True, False)
    }
    assert CHECKED in said[(True, False)]  # a hook is still asking the system of record
    assert BY_A_PERSON in said[(True, True)]  # the hook gave up: escalated
    assert BY_A_PERSON in said[(False, False)]  # nothing but a person will ever check it
    assert BY_A_PERSON in said[(False, True)]
    assert all("not yet known" in message for message in said.values())
    # A process that does not have the tool loaded promises nothing about who checks.
    unloaded = render_operation(before, reconcilable=reconcilable({}, "book_table"))["message"]
    assert CHECKED not in unloaded and BY_A_PERSON not in unloaded
