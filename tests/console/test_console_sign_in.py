"""Sign-ins the console can end, proxies it can sit behind, and pages that fail in one line.

A session cookie names a sign-in the console holds, never an operator: signing out, a password
change, the operator's removal or the end of ``session_secs`` (counted from signing in) ends
it, and a copy of the cookie made before is then worth nothing. Behind a reverse proxy, a
trusted header sent twice names nobody, and decisions come from the public origin the proxy
serves. A list longer than a page says so; a page the ledger cannot answer says that in a line.
"""

from __future__ import annotations

import argparse
import asyncio
import io
from pathlib import Path

import httpx
import pytest

from pipecat_actions.console import ConsoleSettings
from pipecat_actions.console.command import run_users
from pipecat_actions.console.live import Changes as _Changes
from pipecat_actions.console.users import Credentials, UsersFileError
from pipecat_actions.errors import LedgerUnavailable
from pipecat_actions.session import SessionState
from pipecat_actions.status import ActionStatus
from tests._waiting import guarded

from ._support import ConsoleBench, console_bench, field, flash

S = ActionStatus


async def _approve_with(bench: ConsoleBench, cookies: dict[str, str], csrf: str) -> int:
    """Post an approval of a new refund as a copied cookie would; return the response code."""
    op = await bench.ask_refund(SessionState("call-2", principal="alice"), booking_id="bk_0002")
    answer = await bench.client.post(
        f"/approvals/{op.operation_id}/approve",
        data={"reason": "copied", "args_hash": op.args_hash, "csrf": csrf},
        cookies=cookies,
    )
    assert (await bench.runtime.ledger.get(op.operation_id)).status is S.AWAITING_APPROVAL
    return answer.status_code


async def test_a_cookie_copied_before_sign_out_signs_nobody_in_after_it(tmp_path: Path) -> None:
    async with console_bench(tmp_path) as bench:
        await bench.sign_in("rosa")
        csrf = await bench.csrf()
        copied = dict(bench.client.cookies)
        answer = await bench.client.post("/logout", data={"csrf": csrf})
        assert answer.headers["location"] == "/login"
        bench.client.cookies.clear()
        again = await bench.client.get("/", cookies=copied)
        assert again.status_code == 303 and again.headers["location"] == "/login"
        assert await _approve_with(bench, copied, csrf) == 303


async def test_a_password_change_ends_the_sign_ins_made_with_the_old_one(tmp_path: Path) -> None:
    async with console_bench(tmp_path) as bench:
        await bench.sign_in("rosa")
        assert (await bench.client.get("/")).status_code == 200
        Credentials(bench.credentials.path).add("rosa", "a-new-secret")
        assert (await bench.client.get("/")).status_code == 303
        answer = await bench.sign_in("rosa", "a-new-secret")
        assert answer.headers["location"] == "/"
        assert (await bench.client.get("/")).status_code == 200


async def test_a_sign_in_lasts_session_secs_from_signing_in_however_often_it_is_used(
    tmp_path: Path,
) -> None:
    async with console_bench(tmp_path, session_secs=3600.0) as bench:
        await bench.sign_in("rosa")
        for _ in range(3):
            bench.clock.advance(1000)
            assert (await bench.client.get("/")).status_code == 200
        bench.clock.advance(601)  # 3601 s after signing in, used 600 s before
        answer = await bench.client.get("/")
        assert answer.status_code == 303 and answer.headers["location"] == "/login"


async def test_signing_in_again_ends_the_sign_in_the_browser_held(tmp_path: Path) -> None:
    async with console_bench(tmp_path) as bench:
        await bench.sign_in("rosa")
        before = dict(bench.client.cookies)
        await bench.sign_in("rosa")
        assert (await bench.client.get("/")).status_code == 200
        bench.client.cookies.clear()
        assert (await bench.client.get("/", cookies=before)).status_code == 303


async def test_repeated_failed_sign_ins_pause_that_name_even_for_the_right_password(
    tmp_path: Path,
) -> None:
    async with console_bench(tmp_path) as bench:
        for _ in range(5):
            await bench.sign_in("rosa", "guess")
        await bench.sign_in("rosa")
        paused = flash((await bench.client.get("/login")).text)
        assert paused.startswith("Too many failed sign-ins for this name")
        assert (await bench.client.get("/")).status_code == 303
        await bench.sign_in("sam")  # another name is not paused
        assert (await bench.client.get("/")).status_code == 200
        bench.clock.advance(901)
        answer = await bench.sign_in("rosa")
        assert answer.headers["location"] == "/"


@pytest.mark.parametrize("header", ["X-Forwarded-User", "X-Forwarded-Groups"])
async def test_a_trusted_header_sent_twice_names_nobody(tmp_path: Path, header: str) -> None:
    async with console_bench(
        tmp_path, user_header="X-Forwarded-User", roles_header="X-Forwarded-Groups"
    ) as bench:
        headers = [("X-Forwarded-User", "rosa"), ("X-Forwarded-Groups", "manager"), (header, "x")]
        answer = await bench.client.get("/", headers=headers)
    assert answer.status_code == 401
    assert f"{header} was sent 2 times" in answer.text


async def test_behind_a_proxy_that_changes_the_host_decisions_come_from_the_public_origin(
    tmp_path: Path,
) -> None:
    async with console_bench(
        tmp_path,
        user_header="X-Forwarded-User",
        roles_header="X-Forwarded-Groups",
        tenants_header="X-Forwarded-Tenants",
        public_origin="https://Console.Example.com/",
    ) as bench:
        as_rosa = {"X-Forwarded-User": "rosa", "X-Forwarded-Tenants": "*"}
        op = await bench.ask_refund()
        csrf = field((await bench.client.get("/", headers=as_rosa)).text, "csrf")
        for origin in ("http://console.test", "https://evil.example", "null"):
            refused = await bench.client.post(
                f"/approvals/{op.operation_id}/approve",
                data={"reason": "ok", "args_hash": op.args_hash, "csrf": csrf},
                headers={**as_rosa, "Origin": origin},
            )
            assert refused.status_code == 303
            shown = flash((await bench.client.get("/", headers=as_rosa)).text)
            assert "came from another site" in shown, origin
        assert (await bench.runtime.ledger.get(op.operation_id)).status is S.AWAITING_APPROVAL
        approved = await bench.client.post(
            f"/approvals/{op.operation_id}/approve",
            data={"reason": "ok", "args_hash": op.args_hash, "csrf": csrf},
            headers={**as_rosa, "Origin": "https://console.example.com"},
        )
        assert approved.status_code == 303
        done = await bench.settled(op.operation_id)
    assert done.status is S.COMMITTED


@pytest.mark.parametrize(
    "origin", ["console.example.com", "ftp://console.example.com", "https://h/path", "https://"]
)
def test_a_public_origin_that_is_not_scheme_host_port_is_refused(origin: str) -> None:
    with pytest.raises(UsersFileError, match="scheme://host"):
        ConsoleSettings(user_header="X-Forwarded-User", public_origin=origin)


async def test_a_list_longer_than_a_page_says_more_are_not_shown(tmp_path: Path) -> None:
    async with console_bench(tmp_path) as bench:
        await bench.sign_in("rosa")
        for number in range(100):
            await bench.ask_refund(booking_id=f"bk_{number:04d}")
        full = (await bench.client.get("/")).text
        await bench.ask_refund(booking_id="bk_0100")
        over = (await bench.client.get("/")).text
    assert full.count('data-testid="approval"') == 100
    assert 'data-testid="more-approvals"' not in full
    assert over.count('data-testid="approval"') == 100
    assert 'data-testid="more-approvals"' in over
    assert "pipecat-actions approvals list --ledger sqlite:///ledger" in over
    assert "bk_0000" in over and "bk_0100" not in over  # those waiting longest come first


@pytest.mark.parametrize(
    ("failure", "said"),
    [
        (LedgerUnavailable("database is locked"), "The ledger could not be read (database is"),
        (RuntimeError("a bug"), "The console failed on this page; its log has the details."),
    ],
    ids=["ledger", "bug"],
)
async def test_a_page_that_cannot_be_shown_says_why_in_a_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: Exception, said: str
) -> None:
    async with console_bench(tmp_path) as bench:
        await bench.sign_in("rosa")

        async def failing(*_: object, **__: object) -> object:
            raise failure

        monkeypatch.setattr(bench.runtime.ledger, "list", failing)
        # As a server answers: the failure becomes the page, not an exception in the client.
        transport = httpx.ASGITransport(app=bench.app, raise_app_exceptions=False)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://console.test", cookies=bench.client.cookies
        ) as client:
            page = await client.get("/")
            fragment = await client.get("/fragments/approvals")
    assert page.status_code == 503
    assert said in page.text
    assert "Traceback" not in page.text and "a bug" not in page.text
    assert fragment.status_code == 503 and fragment.text == ""


async def test_live_updates_go_on_after_a_read_fails_for_any_reason() -> None:
    answers: list[object] = ["a", RuntimeError("a bug"), KeyError("x"), "b"]

    async def read() -> object:
        answer = answers.pop(0) if answers else "b"
        if isinstance(answer, Exception):
            raise answer
        return answer

    changes = _Changes(read, poll_secs=0.001)
    changes.start()
    try:
        first = await guarded(changes.after(0, within_secs=60), what="the first read")
        second = await guarded(changes.after(first, within_secs=60), what="the change to b")
        await asyncio.sleep(0)
    finally:
        await changes.stop()
    assert (first, second) == (1, 2)


@pytest.mark.parametrize("command", ["add", "remove", "list"])
def test_the_users_commands_print_the_files_path_escaped(tmp_path: Path, command: str) -> None:
    path = tmp_path / "users\x1b]0;owned\x07"
    Credentials(path).add("rosa", "old-secret")
    args = argparse.Namespace(
        users=str(path),
        users_command=command,
        name="rosa",
        role=[],
        tenant=[],
        all_tenants=False,
        password_stdin=True,
    )
    out = io.StringIO()
    if command == "add":
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("sys.stdin", io.StringIO("new-secret\n"))
            assert run_users(args, out) == 0
    else:
        assert run_users(args, out) == 0
    printed = out.getvalue()
    assert "\x1b" not in printed and "\x07" not in printed
    assert r"users\x1b]0;owned\x07" in printed


async def test_guesses_sent_at_once_are_all_counted_against_the_limit(tmp_path: Path) -> None:
    async with console_bench(tmp_path) as bench:
        form = await bench.client.get("/login")
        csrf = field(form.text, "csrf")
        guesses = [
            bench.client.post(
                "/login", data={"name": "rosa", "password": f"guess-{n}", "csrf": csrf}
            )
            for n in range(12)
        ]
        await asyncio.gather(*guesses)
        right = await bench.client.post(
            "/login", data={"name": "rosa", "password": "rosa-secret", "csrf": csrf}
        )
        assert right.headers["location"] == "/login"
        paused = flash((await bench.client.get("/login")).text)
    assert paused.startswith("Too many failed sign-ins for this name")


def test_names_tried_once_never_push_out_the_record_of_the_name_being_guessed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pipecat_actions.console import sign_ins

    monkeypatch.setattr(sign_ins, "SIGN_INS", 3)
    failures = sign_ins.Failures(lambda: 1_000.0)
    for _ in range(5):
        failures.failed(("rosa", "10.0.0.1"))
    for name in ("a", "b", "c", "d", "e"):
        failures.failed((name, "10.0.0.1"))
    # Still paused for the whole window (the clock stands still): its record was kept.
    assert failures.wait_secs(("rosa", "10.0.0.1")) == sign_ins.FAILURE_WINDOW_SECS


async def test_the_live_updates_of_a_sign_in_end_when_it_is_signed_out(tmp_path: Path) -> None:
    async with console_bench(tmp_path) as bench:
        await bench.sign_in("rosa")
        csrf = await bench.csrf()
        stream = asyncio.ensure_future(bench.client.get("/events"))
        await asyncio.sleep(0.1)
        await bench.client.post("/logout", data={"csrf": csrf})
        ended = await guarded(stream, what="the stream to end after sign-out")
    assert ended.status_code == 200
    assert ended.text.startswith("retry: 2000")


async def test_posting_the_sign_in_form_behind_a_proxy_goes_to_the_console(
    tmp_path: Path,
) -> None:
    async with console_bench(tmp_path, user_header="X-Forwarded-User") as bench:
        answer = await bench.client.post("/login", data={"name": "rosa", "password": "x"})
    assert answer.status_code == 303 and answer.headers["location"] == "/"


def test_users_list_has_a_header_and_json(tmp_path: Path) -> None:
    import json

    path = tmp_path / "users"
    Credentials(path).add("rosa", "secret", frozenset({"manager"}), {"main-st", "elm-st"})
    args = argparse.Namespace(users=str(path), users_command="list", json=False)
    out = io.StringIO()
    assert run_users(args, out) == 0
    assert out.getvalue().splitlines()[1].split() == ["NAME", "ROLES", "TENANTS"]
    assert out.getvalue().splitlines()[2].split() == ["rosa", "manager", "elm-st,", "main-st"]
    as_json = io.StringIO()
    assert (
        run_users(argparse.Namespace(users=str(path), users_command="list", json=True), as_json)
        == 0
    )
    assert json.loads(as_json.getvalue()) == [
        {"name": "rosa", "roles": ["manager"], "tenants": ["elm-st", "main-st"]}
    ]
