"""`pipecat-actions approvals`: a person approves or rejects from another process.

The owning runtime runs on a `ManualClock`: it picks an approval made elsewhere up at its lease
heartbeat, which comes round only when the test moves the clock, so "it runs" and "nothing
runs" are both checked after a heartbeat has certainly come and gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pipecat_actions.actions import ActionContext, action
from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.cli import main
from pipecat_actions.clock import ManualClock
from pipecat_actions.console.users import Credentials
from pipecat_actions.ledger import SqlLedger
from pipecat_actions.policy import load_policy_text
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.session import SessionState
from pipecat_actions.status import ActionStatus
from tests._waiting import HANG_GUARD_SECS, eventually

POLICY = """
version: 1
tools:
  refund_deposit:
    kind: mutation
    risk: high
    confirmation:
      mode: approval
      approvers: [bob]
      expires_after_secs: 60
      summary: Refund {amount_cents} cents for booking {booking_id} (paid {before.paid_cents})
"""
LEASE_SECS = 30.0


async def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(main, list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


PASSWORDS = {"bob": "bob-secret", "alice": "alice-secret"}


async def _decide(
    capsys: pytest.CaptureFixture[str],
    verb: str,
    operation_id: str,
    url: str,
    reason: str,
    *extra: str,
    approver: str = "bob",
    password: str | None = None,
) -> tuple[int, str, str]:
    """``pipecat-actions approvals approve|reject OP`` as ``approver`` (bob), signed in.

    An approval names the args hash the operation holds unless ``extra`` gives one.
    """
    if verb == "approve" and "--args-hash" not in extra:
        async with await SqlLedger.create(url, must_exist=True) as ledger:
            extra = (*extra, "--args-hash", (await ledger.get(operation_id)).args_hash)
    typed = PASSWORDS.get(approver, "") if password is None else password
    with _stdin(typed + "\n"):
        return await _cli(
            capsys,
            "approvals",
            verb,
            operation_id,
            "--ledger",
            url,
            "--approver",
            approver,
            "--reason",
            reason,
            "--password-stdin",
            *extra,
        )


@contextlib.contextmanager
def _stdin(text: str) -> Iterator[None]:
    saved = sys.stdin
    sys.stdin = io.StringIO(text)
    try:
        yield
    finally:
        sys.stdin = saved


async def _until(check: Callable[[], bool], what: str) -> None:
    """Poll until ``check()`` holds; only a hang reaches the bound."""
    await eventually(check, what=what)


class _HeartbeatClock(ManualClock):
    """A `ManualClock` that counts the lease heartbeat's sleeps (a third of the lease)."""

    def __init__(self, start: float) -> None:
        super().__init__(start)
        self.heartbeats = 0

    async def sleep(self, secs: float) -> None:
        if secs == LEASE_SECS / 3:
            self.heartbeats += 1  # counted before the first await: the sleep is registered
        await super().sleep(secs)


async def _heartbeat(clock: _HeartbeatClock) -> None:
    """Let the runtime's lease heartbeat (which picks up approved operations) come round once.

    It is woken by the clock and asks for its next sleep once its round is over; whatever
    that round started (a refund run) has then begun.
    """
    await _until(lambda: clock.heartbeats >= 1, "the heartbeat to wait on the clock")
    slept = clock.heartbeats
    clock.advance(LEASE_SECS / 3)
    await _until(lambda: clock.heartbeats > slept, "the heartbeat round to end")


@pytest.fixture
async def waiting(ledger_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    refunds: list[int] = []
    users = Credentials(tmp_path / "users")
    for name, password in PASSWORDS.items():
        users.add(name, password, tenants={"default"})
    monkeypatch.setenv("PIPECAT_ACTIONS_USERS", str(users.path))

    @action
    async def refund_deposit(ctx: ActionContext, booking_id: str, amount_cents: int) -> dict:
        """Refund a booking's deposit to the card that paid it."""
        refunds.append(amount_cents)
        return {"refunded_cents": amount_cents}

    url = ledger_url
    # Near the wall clock: the CLI checks the approval's expiry against real time.
    clock = _HeartbeatClock(time.time())
    runtime = await ActionRuntime.create(
        load_policy_text(POLICY),
        authorizer=AllowAll(),
        actions=[refund_deposit],
        ledger_url=url,
        clock=clock,
        lease_secs=LEASE_SECS,
    )
    session = SessionState(session_id="call-1", principal="alice")
    result = await runtime.propose(
        "refund_deposit", {"booking_id": "b-1", "amount_cents": 2500}, session
    )
    assert result["status"] == "awaiting_approval"
    yield runtime, url, result["operation_id"], refunds, clock
    await runtime.close()


async def test_approval_from_the_cli_runs_the_operation_in_the_owning_runtime(
    waiting: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    runtime, url, operation_id, refunds, clock = waiting
    code, out, _ = await _cli(capsys, "approvals", "list", "--ledger", url, "--json")
    assert code == 0
    listed = json.loads(out)
    assert [op["operation_id"] for op in listed] == [operation_id]
    assert listed[0]["args"] == {"amount_cents": 2500, "booking_id": "b-1"}
    code, out, _ = await _decide(
        capsys,
        "approve",
        operation_id,
        url,
        "deposit policy",
        "--args-hash",
        listed[0]["args_hash"],
    )
    assert code == 0
    assert "ADMITTED" in out
    await _heartbeat(clock)
    final = await asyncio.wait_for(runtime.wait(operation_id), HANG_GUARD_SECS)
    assert final.status is ActionStatus.COMMITTED
    assert refunds == [2500]
    actors = [e.actor for e in await runtime.ledger.events(operation_id)]
    assert "approver:bob" in actors


async def test_approval_for_other_arguments_is_refused_and_nothing_runs(
    waiting: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    runtime, url, operation_id, refunds, clock = waiting
    code, _, err = await _decide(
        capsys, "approve", operation_id, url, "ok", "--args-hash", "0" * 64
    )
    assert code == 1
    assert "other arguments" in err
    assert "Traceback" not in err
    await _heartbeat(clock)  # the owner looked for approved work, and found none
    assert (await runtime.ledger.get(operation_id)).status is ActionStatus.AWAITING_APPROVAL
    assert refunds == []


async def test_an_approval_naming_the_hash_as_the_table_shortens_it_says_to_give_all_of_it(
    waiting: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    runtime, url, operation_id, _, _ = waiting
    args_hash = (await runtime.ledger.get(operation_id)).args_hash
    code, _, err = await _decide(
        capsys, "approve", operation_id, url, "ok", "--args-hash", args_hash[:12]
    )
    assert code == 1
    assert "the whole args hash" in err
    assert (await runtime.ledger.get(operation_id)).status is ActionStatus.AWAITING_APPROVAL
    code, out, err = await _decide(
        capsys, "approve", operation_id, url, "ok", "--args-hash", args_hash.upper()
    )
    assert code == 0, err
    assert "ADMITTED" in out


async def test_rejection_from_the_cli_is_final_and_nothing_runs(
    waiting: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    runtime, url, operation_id, refunds, clock = waiting
    code, out, _ = await _decide(capsys, "reject", operation_id, url, "not eligible")
    assert code == 0
    assert "REJECTED" in out
    op = await runtime.ledger.get(operation_id)
    assert op.status is ActionStatus.REJECTED
    assert op.error == "rejected by bob: not eligible"
    code, _, err = await _decide(capsys, "approve", operation_id, url, "changed my mind")
    assert code == 1
    assert "not awaiting approval" in err
    await _heartbeat(clock)  # the owner looked for approved work, and found none
    assert (await runtime.ledger.get(operation_id)).status is ActionStatus.REJECTED
    assert refunds == []


async def test_show_of_an_unknown_operation_is_a_one_line_error(
    waiting: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    _, url, _, _, _ = waiting
    code, _, err = await _cli(capsys, "approvals", "show", "op_nope", "--ledger", url)
    assert code == 1
    assert err.strip() == "pipecat-actions: operation op_nope not found"


async def test_an_approval_in_the_last_third_of_the_lease_before_the_window_closes_is_carried_out(
    waiting: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # The approval window (60 s) closes before the owner's next heartbeat can pick the
    # approval up: the window's deadline, armed in the owner's memory, used to fire on the now
    # ADMITTED operation and fail it "deadline passed before it could be sent", after the CLI
    # had printed ADMITTED. The deadline applied is the ledger's: it runs.
    runtime, url, operation_id, refunds, clock = waiting
    clock.advance(55)  # within the last lease/3 of the window
    code, out, _ = await _decide(capsys, "approve", operation_id, url, "deposit policy")
    assert code == 0
    assert "ADMITTED" in out
    clock.advance(6)  # the window's end passes: the old deadline fires in the owner
    await _heartbeat(clock)
    final = await asyncio.wait_for(runtime.wait(operation_id), HANG_GUARD_SECS)
    assert final.status is ActionStatus.COMMITTED, final.error
    assert refunds == [2500]


async def test_a_rejection_from_the_cli_is_told_to_the_live_conversation(
    waiting: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # An approval made elsewhere reached the conversation; a rejection made the same way was
    # never told: the owner only looked for approved work.
    runtime, url, operation_id, refunds, clock = waiting
    heard: list[ActionStatus] = []
    runtime.listen("call-1", lambda op: heard.append(op.status))
    code, _, _ = await _decide(capsys, "reject", operation_id, url, "not eligible")
    assert code == 0
    await _heartbeat(clock)
    final = await asyncio.wait_for(runtime.wait(operation_id), HANG_GUARD_SECS)
    assert final.status is ActionStatus.REJECTED
    assert heard == [ActionStatus.REJECTED]
    assert refunds == []


async def test_an_approval_without_the_args_hash_is_a_usage_error(
    waiting: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    runtime, url, operation_id, _refunds, _clock = waiting
    with _stdin("bob-secret\n"), pytest.raises(SystemExit) as usage:
        main([
            "approvals", "approve", operation_id, "--ledger", url,
            "--approver", "bob", "--reason", "ok", "--password-stdin",
        ])  # fmt: skip
    code, err = usage.value.code, capsys.readouterr().err
    assert code == 2
    assert "--args-hash" in err
    assert (await runtime.ledger.get(operation_id)).status is ActionStatus.AWAITING_APPROVAL


@pytest.mark.parametrize(
    ("approver", "password", "refusal"),
    [
        ("bob", "guess", "unknown approver or wrong password"),
        ("mallory", "x", "unknown approver or wrong password"),
        ("", "", "unknown approver or wrong password"),
        ("alice", None, "a requester never decides on their own request"),
    ],
    ids=["wrong-password", "unknown", "blank", "requester"],
)
@pytest.mark.parametrize("verb", ["approve", "reject"])
async def test_a_decision_from_the_cli_is_made_by_a_signed_in_approver_only(
    waiting: Any,
    capsys: pytest.CaptureFixture[str],
    verb: str,
    approver: str,
    password: str | None,
    refusal: str,
) -> None:
    runtime, url, operation_id, refunds, clock = waiting
    code, _out, err = await _decide(
        capsys, verb, operation_id, url, "ok", approver=approver, password=password
    )
    assert code == 1
    assert refusal in err and "Traceback" not in err
    assert err.count("\n") == 1
    await _heartbeat(clock)
    assert (await runtime.ledger.get(operation_id)).status is ActionStatus.AWAITING_APPROVAL
    assert refunds == []


async def test_a_decision_without_a_credentials_file_says_how_to_make_one(
    waiting: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime, url, operation_id, _refunds, _clock = waiting
    monkeypatch.delenv("PIPECAT_ACTIONS_USERS")
    code, _, err = await _decide(capsys, "reject", operation_id, url, "no")
    assert code == 1
    assert "--users FILE" in err and "pipecat-actions users add" in err
    assert (await runtime.ledger.get(operation_id)).status is ActionStatus.AWAITING_APPROVAL


async def test_the_users_command_adds_lists_and_removes_operators(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    users = str(tmp_path / "ops" / "users")
    with _stdin("s3cret\n"):
        code, out, _ = await _cli(
            capsys, "users", "add", "rosa", "--role", "manager", "--tenant", "main-st",
            "--users", users, "--password-stdin",
        )  # fmt: skip
    assert code == 0 and "rosa (manager; tenants: main-st)" in out
    assert Credentials(users).authenticate("rosa", "s3cret") is not None
    code, out, _ = await _cli(capsys, "users", "list", "--users", users)
    assert code == 0 and "rosa" in out and "manager" in out and "s3cret" not in out
    code, _, err = await _cli(capsys, "users", "remove", "nobody", "--users", users)
    assert code == 1 and "nobody is not in" in err
    code, out, _ = await _cli(capsys, "users", "remove", "rosa", "--users", users)
    assert code == 0
    assert Credentials(users).operators() == {}
    with _stdin("pw\n"):
        code, _, err = await _cli(
            capsys, "users", "add", "[/x]", "--users", users, "--password-stdin"
        )
    assert code == 1 and "not an approver name" in err


async def test_the_cli_records_which_credentials_file_vouched_for_the_approver(
    waiting: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    runtime, url, operation_id, _, _ = waiting
    code, _, err = await _decide(capsys, "approve", operation_id, url, "deposit policy")
    assert code == 0, err
    (decided,) = [
        e for e in await runtime.ledger.events(operation_id) if e.to_status is ActionStatus.ADMITTED
    ]
    assert decided.detail["via"] == f"cli: credentials file {tmp_path / 'users'}"


async def test_a_credentials_file_others_can_write_is_refused(
    waiting: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    runtime, url, operation_id, _, _ = waiting
    (tmp_path / "users").chmod(0o622)
    code, _, err = await _decide(capsys, "approve", operation_id, url, "deposit policy")
    assert code == 1
    assert "can be changed by others than its owner (mode 622)" in err
    assert (await runtime.ledger.get(operation_id)).status is ActionStatus.AWAITING_APPROVAL


async def test_approvals_list_prints_every_waiting_request_expiring_first(
    ledger_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipecat_actions.ledger import NewOperation

    async with await SqlLedger.create(ledger_url) as ledger:
        for number in range(1002):
            await ledger.admit(
                NewOperation(
                    tool="refund_deposit",
                    kind="mutation",
                    args={"n": number},
                    idempotency_key=f"k{number}",
                    session_id="s",
                    principal="alice",
                    status=ActionStatus.AWAITING_APPROVAL,
                    deadline_at=2_000_000_000.0 - number,
                )
            )
    code, out, _ = await _cli(capsys, "approvals", "list", "--ledger", ledger_url, "--json")
    assert code == 0
    listed = json.loads(out)
    assert len(listed) == 1002
    assert listed[0]["args"] == {"n": 1001}  # the newest expires first here


async def test_approvals_show_says_what_the_tool_does_and_what_is_approved_in_words(
    waiting: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    runtime, url, operation_id, _, _ = waiting
    hostile = await runtime.propose(
        "refund_deposit",
        {"booking_id": "b-2\x1b]0;owned\x07", "amount_cents": 1},
        SessionState(session_id="call-2", principal="carol"),
    )
    code, out, _ = await _cli(capsys, "approvals", "show", operation_id, "--ledger", url)
    assert code == 0
    assert "description: Refund a booking's deposit to the card that paid it." in out
    # No snapshot was taken: the before-state field is shown as missing, not left out.
    assert "summary: Refund 2500 cents for booking b-1 (paid [missing: before.paid_cents])" in out
    assert "tenant: default" in out
    code, out, _ = await _cli(capsys, "approvals", "show", operation_id, "--ledger", url, "--json")
    assert json.loads(out)["summary"] == (
        "Refund 2500 cents for booking b-1 (paid [missing: before.paid_cents])"
    )
    code, out, _ = await _cli(
        capsys, "approvals", "show", str(hostile["operation_id"]), "--ledger", url
    )
    assert "\x1b" not in out and "\x07" not in out
    assert r"for booking b-2\x1b]0;owned\x07 (paid" in out


async def test_an_approver_of_another_tenant_is_refused_from_the_cli_and_it_is_recorded(
    waiting: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    runtime, url, operation_id, refunds, clock = waiting
    Credentials(tmp_path / "users").set_tenants("bob", ["main-st"])
    code, _, err = await _decide(capsys, "approve", operation_id, url, "deposit policy")
    assert code == 1
    assert f"bob may not approve operation {operation_id}: it belongs to tenant 'default'" in err
    assert "Traceback" not in err
    await _heartbeat(clock)
    assert (await runtime.ledger.get(operation_id)).status is ActionStatus.AWAITING_APPROVAL
    assert refunds == []
    (note,) = [
        e.detail
        for e in await runtime.ledger.events(operation_id)
        if "decision_refused" in (e.detail or {})
    ]
    assert note["approver"] == "bob" and note["tenants"] == ["main-st"]
    assert note["via"] == f"cli: credentials file {tmp_path / 'users'}"


async def test_an_approver_whose_line_predates_tenants_is_told_how_to_give_them_some(
    waiting: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from pipecat_actions.console.users import hash_password

    runtime, url, operation_id, _, _ = waiting
    path = tmp_path / "users"
    path.write_text(f"bob::{hash_password(PASSWORDS['bob'])}\n")
    path.chmod(0o600)
    code, _, err = await _decide(capsys, "reject", operation_id, url, "no")
    assert code == 1
    assert "bob belongs to no tenant, so may reject nothing" in err
    assert "`pipecat-actions users tenants bob --tenant TENANT` (or --all-tenants)" in err
    assert (await runtime.ledger.get(operation_id)).status is ActionStatus.AWAITING_APPROVAL
