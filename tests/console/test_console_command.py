"""``pipecat-actions console`` as a newcomer runs it: one line for each mistake, a clean stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from pipecat_actions.cli import main
from pipecat_actions.console.users import Credentials
from tests._waiting import HANG_GUARD_SECS


def _ledger(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    assert main(["db", "upgrade", "--ledger", url]) == 0
    return url


def _console(*argv: str, cwd: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("PIPECAT_ACTIONS_USERS", None)
    return subprocess.Popen(
        [sys.executable, "-m", "pipecat_actions.cli", "console", *argv],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_the_console_serves_names_its_ledger_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    url = _ledger(tmp_path)
    Credentials(tmp_path / "users").add("rosa", "pw", frozenset({"manager"}), {"default"})
    console = _console(
        "--ledger", url, "--users", str(tmp_path / "users"), "--port", "0", cwd=tmp_path
    )
    try:
        assert console.stdout is not None
        named = console.stdout.readline()
        where = console.stdout.readline()
        assert named.strip() == f"ledger: sqlite:///{tmp_path / 'ledger.db'}"  # as the CLI says
        assert where.startswith("console on http://127.0.0.1:")
        base = where.split()[2].rstrip("/")
        assert httpx.get(f"{base}/login", timeout=HANG_GUARD_SECS).status_code == 200
        assert httpx.get(f"{base}/", timeout=HANG_GUARD_SECS).status_code == 303
    finally:
        console.send_signal(signal.SIGINT)
        _, err = console.communicate(timeout=HANG_GUARD_SECS)
    assert "Traceback" not in err, err
    assert console.returncode in (0, 130)


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--users", "users"], "no ledger"),
        (["--ledger", "LEDGER"], "one way: give a credentials file"),
        (["--ledger", "LEDGER", "--users", "nope"], "cannot read the credentials file"),
        (
            ["--ledger", "LEDGER", "--users", "users", "--user-header", "X-Forwarded-User"],
            "not both or neither",
        ),
        (
            ["--ledger", "LEDGER", "--users", "users", "--app", "no_such_ops_module:app"],
            "no_such_ops_module",
        ),
    ],
    ids=["missing-ledger", "no-sign-in", "missing-users-file", "two-sign-ins", "bad-app"],
)
def test_a_console_that_cannot_start_says_why_in_one_line(
    tmp_path: Path, argv: list[str], problem: str
) -> None:
    url = _ledger(tmp_path / "there")
    Credentials(tmp_path / "users").add("rosa", "pw", tenants={"default"})
    args = [a.replace("LEDGER", url) for a in argv]
    if "--ledger" not in args:
        args += ["--ledger", f"sqlite:///{tmp_path / 'absent' / 'ledger.db'}"]
    console = _console(*args, "--port", "0", cwd=tmp_path)
    _, err = console.communicate(timeout=HANG_GUARD_SECS)
    assert console.returncode == 1, err
    assert problem in err and "Traceback" not in err, err
    assert err.count("\n") == 1, err
    assert not (tmp_path / "absent").exists()


def test_a_console_behind_a_proxy_without_a_tenants_header_says_nobody_decides(
    tmp_path: Path,
) -> None:
    url = _ledger(tmp_path)
    console = _console(
        "--ledger", url, "--user-header", "X-Forwarded-User", "--port", "0", cwd=tmp_path
    )
    try:
        assert console.stdout is not None
        console.stdout.readline()
        assert console.stdout.readline().startswith("console on http://127.0.0.1:")
    finally:
        console.send_signal(signal.SIGINT)
        _, err = console.communicate(timeout=HANG_GUARD_SECS)
    assert err.splitlines() == [
        "pipecat-actions: console: no --tenants-header: operators the proxy signs in belong to "
        "no tenant and may decide nothing"
    ]
