"""What the operator's commands print cannot fool the person reading it.

Whatever a ledger holds (it is written by tool calls, applications and other processes), the
text output shows it as it is stored: never read as rich markup, never a control character or
a bidi override that the terminal would obey; it names the ledger it read on its first line;
``--json`` prints the JSON alone; a reader that goes away ends the command quietly.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import unicodedata
from pathlib import Path
from typing import Any

import pytest

from pipecat_actions._printable import printable
from pipecat_actions.cli import main
from pipecat_actions.ledger import NewOperation, SqlLedger
from pipecat_actions.status import ActionStatus

S = ActionStatus
APP = "tests._operator_app:app"
COMMAND = str(Path(sys.executable).with_name("pipecat-actions"))
ESC = "\x1b"
LINK = f"{ESC}]8;;https://evil.example/{ESC}\\click{ESC}]8;;{ESC}\\"  # OSC 8 hyperlink
TITLE = f"{ESC}]0;owned\x07"  # sets the terminal window's title
CSI_C1 = "\x9b2J"  # the one-byte C1 form of ESC [ : clears the screen
RLO = "\u202e"  # right-to-left override: "bob<RLO>lanigiro" reads "boboriginal"
ISOLATE = "\u2066x\u2069"
HIDDEN = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def _obeyable(text: str) -> list[str]:
    """The characters of ``text`` a terminal would act on (line breaks aside)."""
    return [c for c in text if c != "\n" and unicodedata.category(c) in HIDDEN]


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _new(tool: str, principal: str, key: str, **extra: Any) -> NewOperation:
    fields: dict[str, Any] = {
        "tool": tool,
        "kind": "mutation",
        "args": {"note": f"{ESC}[2J{ISOLATE}\x7f", "link": LINK},
        "idempotency_key": key,
        "session_id": f"call{TITLE}",
        "principal": principal,
        "status": S.RUNNING,
    }
    fields.update(extra)
    return NewOperation(**fields)


@pytest.fixture
def hostile(tmp_path: Path) -> tuple[str, dict[str, str]]:
    """A ledger whose names, arguments, errors and audit trail hold markup and escapes."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ids: dict[str, str] = {}

    async def fill() -> None:
        ledger = await SqlLedger.create(url)
        try:
            markup = (await ledger.admit(_new("[/x]", "[mallory]alice", "k1"))).operation
            await ledger.transition(
                markup.operation_id,
                expected=S.RUNNING,
                to=S.COMMITTED,
                fence=1,
                actor=f"bot{TITLE}",
                changes={"result": {"ok": f"{CSI_C1}done"}},
            )
            ids["markup"] = markup.operation_id
            failed = (await ledger.admit(_new(f"book{LINK}", f"bob{RLO}lanigiro", "k2"))).operation
            await ledger.transition(
                failed.operation_id,
                expected=S.RUNNING,
                to=S.FAILED_FINAL,
                fence=1,
                actor="bot",
                changes={"error": f"boom{ESC}[31m\nforged  line  COMMITTED"},
            )
            ids["failed"] = failed.operation_id
            waiting = _new(
                f"refund{TITLE}",
                f"[bold]eve{RLO}",
                "k3",
                status=S.AWAITING_APPROVAL,
                deadline_at=time.time() + 600,
            )
            ids["waiting"] = (await ledger.admit(waiting)).operation.operation_id
            unknown = (await ledger.admit(_new(f"charge{CSI_C1}", "carol", "k4"))).operation
            await ledger.transition(
                unknown.operation_id, expected=S.RUNNING, to=S.UNKNOWN, fence=1, actor="bot"
            )
            await ledger.record_refusal(
                _new(
                    "[/x]",
                    "alice",
                    "k5",
                    detail={"reason": f"not_authorized{ESC}[5m", "by": TITLE},
                )
            )
        finally:
            await ledger.close()

    asyncio.run(fill())
    return url, ids


def _text_commands(url: str, ids: dict[str, str]) -> list[list[str]]:
    return [
        ["ledger", "list", "--ledger", url],
        ["ledger", "show", ids["markup"], "--ledger", url],
        ["ledger", "show", ids["failed"], "--ledger", url],
        ["ledger", "show", ids["waiting"], "--ledger", url],
        ["undelivered", "--ledger", url],
        ["approvals", "list", "--ledger", url],
        ["approvals", "show", ids["waiting"], "--ledger", url],
        ["stats", "--ledger", url],
        ["reconcile", "--all", "--app", APP, "--ledger", url],
    ]


def test_printable_escapes_every_control_format_and_separator_character_visibly() -> None:
    assert printable(f"a{ESC}[31mb") == "a\\x1b[31mb"
    assert printable(LINK) == "\\x1b]8;;https://evil.example/\\x1b\\click\\x1b]8;;\\x1b\\"
    assert printable(TITLE) == "\\x1b]0;owned\\x07"
    assert printable("\x00\x7f\x85\x9b") == "\\x00\\x7f\\x85\\x9b"
    assert printable("\u202a\u202b\u202c\u202d\u202e") == "\\u202a\\u202b\\u202c\\u202d\\u202e"
    assert printable("\u2066\u2067\u2068\u2069") == "\\u2066\\u2067\\u2068\\u2069"
    assert printable("ali\u200bce\u2028") == "ali\\u200bce\\u2028"  # zero width, line separator
    assert printable("one\ntwo\tthree\r") == "one\\ntwo\\tthree\\r"
    assert printable("\ud800") == "\\ud800"  # a lone surrogate: no terminal could be sent it
    assert printable("José 予約 [bold] \\x1b") == "José 予約 [bold] \\x1b"  # left as it is


def test_ledger_content_is_never_read_as_markup(
    hostile: tuple[str, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = hostile
    code, out, err = _cli(capsys, "ledger", "list", "--ledger", url)
    assert code == 0, err
    row = next(line for line in out.splitlines() if "alice" in line)
    assert row.split()[1:4] == ["[/x]", "COMMITTED", "[mallory]alice"]
    code, out, err = _cli(capsys, "undelivered", "--ledger", url)
    assert code == 0, err
    assert "[mallory]alice" in out
    code, out, err = _cli(capsys, "approvals", "list", "--ledger", url)
    assert code == 0, err
    assert "[bold]eve" in out


def test_json_output_renders_no_text_and_holds_the_exact_values(
    hostile: tuple[str, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, ids = hostile
    code, out, err = _cli(capsys, "ledger", "list", "--ledger", url, "--json")
    assert code == 0, err
    rows = {row["operation_id"]: row for row in json.loads(out)}
    assert (rows[ids["markup"]]["tool"], rows[ids["markup"]]["principal"]) == (
        "[/x]",
        "[mallory]alice",
    )
    assert rows[ids["failed"]]["tool"] == f"book{LINK}"
    assert rows[ids["failed"]]["error"] == f"boom{ESC}[31m\nforged  line  COMMITTED"
    assert not _obeyable(out)  # json.dumps escapes them itself
    for argv in _text_commands(url, ids):
        code, out, err = _cli(capsys, *argv, "--json")
        assert code == 0, (argv, err)
        json.loads(out)
        assert not _obeyable(out + err), argv


def test_no_command_sends_the_terminal_a_control_character_from_the_ledger(
    hostile: tuple[str, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, ids = hostile
    for argv in _text_commands(url, ids):
        code, out, err = _cli(capsys, *argv)
        assert code == 0, (argv, err)
        assert not _obeyable(out + err), (argv, _obeyable(out + err))
    _, out, _ = _cli(capsys, "ledger", "show", ids["failed"], "--ledger", url)
    assert "tool: book\\x1b]8;;https://evil.example/" in out
    assert "principal: bob\\u202elanigiro" in out
    # The error's newline is shown, not obeyed: no line of its own says COMMITTED.
    assert "error: boom\\x1b[31m\\nforged  line  COMMITTED" in out
    assert not any(line.startswith("forged") for line in out.splitlines())


def test_an_error_line_is_printable_too(
    hostile: tuple[str, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = hostile
    code, _, err = _cli(capsys, "ledger", "show", f"op{ESC}]0;x\x07", "--ledger", url)
    assert code == 1
    assert err == "pipecat-actions: operation op\\x1b]0;x\\x07 not found\n"


def test_every_text_output_starts_with_the_ledger_it_read_and_json_says_it_on_stderr(
    hostile: tuple[str, dict[str, str]], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url, ids = hostile
    named = f"ledger: sqlite:///{tmp_path / 'ledger.db'}"
    for argv in [
        ["db", "status", "--ledger", url],
        ["db", "upgrade", "--ledger", url],
        *_text_commands(url, ids),
    ]:
        code, out, _ = _cli(capsys, *argv)
        assert code == 0, argv
        assert out.splitlines()[0] == named, argv
        code, out, err = _cli(capsys, *argv, "--json")
        assert code == 0, argv
        json.loads(out)
        assert err.splitlines()[0] == named, argv


@pytest.mark.postgres
def test_a_postgres_ledger_is_named_with_its_password_hidden(
    pg_session_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with_password = pg_session_url.replace("postgres@", "postgres:s3cret@", 1)
    assert with_password != pg_session_url
    assert main(["db", "upgrade", "--ledger", with_password]) == 0
    code, out, err = _cli(capsys, "ledger", "list", "--ledger", with_password)
    assert code == 0, err
    shown = pg_session_url.replace("postgres@", "postgres:***@", 1)
    assert out.splitlines()[0] == f"ledger: {shown}"
    assert "s3cret" not in out + err


def test_ledger_show_prints_fields_indented_arguments_and_a_timeline_table(
    hostile: tuple[str, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, ids = hostile
    code, out, _ = _cli(capsys, "ledger", "show", ids["markup"], "--ledger", url)
    assert code == 0
    lines = out.splitlines()
    assert f"operation_id: {ids['markup']}" in lines
    assert "tool: [/x]" in lines
    assert "status: COMMITTED" in lines
    assert "escalated: no" in lines
    args = lines.index("args:")
    assert lines[args + 1] == "  {"
    assert '    "note": "\\u001b[2J\\u2066x\\u2069\\x7f"' in lines[args + 2 : args + 4]
    result = lines.index("result:")
    assert lines[result + 2] == '    "ok": "\\x9b2Jdone"'
    header = lines[lines.index("audit timeline:") + 1]
    assert header.split() == ["seq", "at", "event", "from", "to", "actor", "detail"]
    committed = next(line for line in lines if line.split()[3:5] == ["RUNNING", "COMMITTED"])
    assert committed.split()[5] == "bot\\x1b]0;owned\\x07"


def test_approvals_list_is_a_table_with_a_header_and_show_is_readable_text(
    hostile: tuple[str, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, ids = hostile
    _, out, _ = _cli(capsys, "approvals", "show", ids["waiting"], "--ledger", url, "--json")
    waiting = json.loads(out)
    code, out, _ = _cli(capsys, "approvals", "list", "--ledger", url)
    assert code == 0
    lines = out.splitlines()
    assert lines[1].split() == [
        "operation", "tool", "tenant", "requester", "args", "hash", "expires",
    ]  # fmt: skip
    (row,) = [line for line in lines if ids["waiting"] in line]
    assert row.split()[:5] == [
        ids["waiting"],
        "refund\\x1b]0;owned\\x07",
        waiting["tenant"],
        "[bold]eve\\u202e",
        waiting["args_hash"][:12],
    ]
    code, out, _ = _cli(capsys, "approvals", "show", ids["waiting"], "--ledger", url)
    assert code == 0
    lines = out.splitlines()
    assert f"args_hash: {waiting['args_hash']}" in lines
    assert "status: AWAITING_APPROVAL" in lines
    assert lines[lines.index("args:") + 1] == "  {"
    assert not out.lstrip().startswith("{")


def test_a_closed_pipe_ends_the_command_quietly_as_sigpipe_would(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    rows = 3000  # ~140 bytes a row as text: many times what a pipe holds

    async def fill() -> None:
        async with await SqlLedger.create(url) as ledger:
            for i in range(rows):
                await ledger.record_completed(
                    _new("lookup", "alice", f"k{i}", kind="read", status=S.COMMITTED)
                )

    asyncio.run(fill())
    for argv in (["ledger", "list"], ["ledger", "list", "--json"]):
        reader = subprocess.Popen(
            [COMMAND, *argv, "--ledger", url, "--limit", str(rows)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert reader.stdout is not None and reader.stderr is not None
        assert reader.stdout.readline()  # the command is writing; the reader goes away
        reader.stdout.close()
        err = reader.stderr.read()
        assert reader.wait() == 141, err
        assert "Traceback" not in err
        assert "Error" not in err


def test_policy_check_quotes_a_hostile_key_without_letting_the_terminal_obey_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "policy.yaml"
    # Written with YAML's own escapes (a raw ESC is not allowed in a YAML file).
    bad.write_text(
        'version: 1\ntools:\n  "bo\\e]0;owned\\aok":\n    kind: mutation\n'
        '  book:\n    kind: mutation\n    "\\e[31mevil\\u202e": 1\n'
    )
    code, out, err = _cli(capsys, "policy", "check", str(bad))
    assert code == 1
    assert _obeyable(out + err) == []
    assert r"bo\x1b]0;owned\x07ok" in err and r"\x1b[31mevil\u202e" in err


def test_a_usage_error_quotes_what_was_typed_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    from pipecat_actions.cli import main

    with pytest.raises(SystemExit) as done:
        main(["ledger", "list", "\x1b]0;TITLE\x07"])
    err = capsys.readouterr().err
    assert done.value.code == 2
    assert "\x1b" not in err and "\x07" not in err
    assert r"\x1b]0;TITLE\x07" in err


def test_approvals_show_prints_what_the_approver_decides_on_as_the_console_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"

    async def ask() -> str:
        async with await SqlLedger.create(url) as ledger:
            asked = _new(
                "refund",
                "alice",
                "k1",
                status=S.AWAITING_APPROVAL,
                deadline_at=time.time() + 600,
                rationale=f"the guest{TITLE} asked",
                before_state={"balance_cents": 2500, "note": RLO},
                detail={"approval": {"approvers": ["bob"], "roles": ["manager"], "risk": "high"}},
            )
            return (await ledger.admit(asked)).operation.operation_id

    operation_id = asyncio.run(ask())
    code, out, err = _cli(capsys, "approvals", "show", operation_id, "--ledger", url)
    assert code == 0, err
    lines = out.splitlines()
    assert "rationale: the guest\\x1b]0;owned\\x07 asked" in lines
    assert "risk: high" in lines
    assert "approvers: bob" in lines
    assert "approver_roles: manager" in lines
    before = lines.index("before_state:")
    assert '    "balance_cents": 2500,' in lines[before + 1 : before + 4]
    assert not _obeyable(out)
    code, out, _ = _cli(capsys, "approvals", "show", operation_id, "--ledger", url, "--json")
    shown = json.loads(out)
    assert shown["before_state"] == {"balance_cents": 2500, "note": RLO}
    assert (shown["risk"], shown["approvers"], shown["approver_roles"]) == (
        "high",
        ["bob"],
        ["manager"],
    )
