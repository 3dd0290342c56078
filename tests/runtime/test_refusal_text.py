"""What a refusal reflects of the call is bounded and escaped, in the result and in the record.

A refusal quotes what the model supplied (the tool name it called, an argument key, a value an
application's reason names): a short prefix with a note of the length, never the whole of it,
and control and bidi characters as visible escapes, never raw. The same text is the refusal's
``error`` in the ledger.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipecat_actions._printable import printable
from pipecat_actions.actions import ActionContext, Refused, action
from pipecat_actions.admission.admitter import MAX_MESSAGE_CHARS
from pipecat_actions.admission.authorization import AuthorizationRequest, Decision
from pipecat_actions.clock import ManualClock
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.session import SessionState
from pipecat_actions.testing import capture_logs

from ._admission_support import assert_refusal_audited, policy, sqlite_url

TOOLS = """
  add_note:
    kind: mutation
    max_payload_bytes: 1000000
  check_note:
    kind: mutation
    max_payload_bytes: 1000000
"""
HOSTILE = "\x1b]0;owned\x07\x1b[2J\u202eevil\u2066\n\r\x00\x85\u200b"

MAX_NOTE_CHARS = 40
"""The longest note of a cut ("… (10485760 characters)")."""


class EchoingAuthorizer:
    """Refuses ``add_note`` with a reason that quotes the text the model sent, whole."""

    async def authorize(self, request: AuthorizationRequest) -> Decision:
        if request.tool != "add_note":
            return Decision.allow()
        return Decision.deny(f"a note may not say {request.args.get('text')}")


def _actions() -> list[Any]:
    @action
    async def add_note(ctx: ActionContext, text: str) -> dict[str, Any]:
        """Add a note."""
        return {"noted": True}

    async def refuse(ctx: ActionContext) -> None:
        raise Refused(f"no such note: {ctx.args.get('text')}", code="no_such_note")

    @action(preconditions=refuse)
    async def check_note(ctx: ActionContext, text: str) -> dict[str, Any]:
        """Check a note."""
        return {}

    return [add_note, check_note]


async def _runtime(tmp_path: Path) -> ActionRuntime:
    return await ActionRuntime.create(
        policy(TOOLS),
        authorizer=EchoingAuthorizer(),
        actions=_actions(),
        ledger_url=sqlite_url(tmp_path),
        clock=ManualClock(),
    )


def _assert_bounded_and_escaped(message: str) -> None:
    assert len(message) <= MAX_MESSAGE_CHARS + MAX_NOTE_CHARS, len(message)
    assert printable(message) == message, message[:200]


async def test_a_10_mb_tool_name_is_quoted_back_as_a_short_prefix_and_its_length(
    ledger_url: str,
) -> None:
    name = "x" * (10 * 1024 * 1024)
    runtime = await ActionRuntime.create(
        policy(TOOLS), authorizer=EchoingAuthorizer(), actions=_actions(), ledger_url=ledger_url
    )
    try:
        with capture_logs("DEBUG") as lines:
            result = await runtime.propose(name, {}, SessionState("s", principal="alice"))

        op = await assert_refusal_audited(runtime, result, "unknown_tool")
        assert f"({len(name)} characters)" in result["message"]
        assert len(result["message"]) < 200
        assert op.error == result["message"]
        assert len(op.tool) <= 64
        # Neither the log nor the metrics keep the name: one label for every unknown tool.
        assert lines and all(len(line) < 2000 for line in lines)
        assert all(len(tool) <= 64 for tool in runtime.metrics.snapshot()["tools"])
    finally:
        await runtime.close(grace_secs=0)


async def test_control_characters_of_an_argument_key_are_escaped_in_result_and_record(
    ledger_url: str,
) -> None:
    runtime = await ActionRuntime.create(
        policy(TOOLS), authorizer=EchoingAuthorizer(), actions=_actions(), ledger_url=ledger_url
    )
    try:
        key = f"{HOSTILE}note"
        result = await runtime.propose(
            "add_note", {"text": "hi", key: 1}, SessionState("s", principal="alice")
        )

        op = await assert_refusal_audited(runtime, result, "invalid_arguments")
        assert printable(key)[:30] in result["message"]  # escaped, and cut if long
        assert op.error == result["message"]
        _assert_bounded_and_escaped(op.error)
    finally:
        await runtime.close(grace_secs=0)


async def test_an_applications_reason_quoting_the_call_is_bounded_and_escaped(
    tmp_path: Path,
) -> None:
    runtime = await _runtime(tmp_path)
    try:
        text = HOSTILE * 10_000
        for tool, reason in (("add_note", "not_authorized"), ("check_note", "no_such_note")):
            result = await runtime.propose(
                tool, {"text": text}, SessionState(tool, principal="alice")
            )

            op = await assert_refusal_audited(runtime, result, reason)
            _assert_bounded_and_escaped(result["message"])
            assert op.error == result["message"]
    finally:
        await runtime.close(grace_secs=0)


_hostile_text = st.text(
    st.characters(codec="utf-8") | st.sampled_from(list(HOSTILE)), max_size=200
) | st.builds(
    lambda text, times: text * times, st.text(min_size=1, max_size=8), st.integers(1, 5000)
)


def test_any_refusal_quotes_the_model_bounded_and_escaped(tmp_path: Path) -> None:
    numbers = itertools.count()
    with asyncio.Runner() as runner:
        runtime = runner.run(_runtime(tmp_path))
        try:

            @settings(
                max_examples=150,
                deadline=None,
                database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
            )
            @given(
                tool=st.sampled_from(["add_note", "check_note"]) | _hostile_text,
                key=st.sampled_from(["text"]) | _hostile_text,
                value=_hostile_text,
            )
            def check(tool: str, key: str, value: str) -> None:
                session = SessionState(f"h{next(numbers)}", principal="alice")
                result = runner.run(runtime.propose(tool, {key: value}, session))
                assert result["status"] == "refused", result
                op = runner.run(runtime.ledger.get(result["operation_id"]))
                _assert_bounded_and_escaped(result["message"])
                assert op.error == result["message"]

            check()
        finally:
            runner.run(runtime.close(grace_secs=0))
