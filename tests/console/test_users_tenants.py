"""The tenants of an operator in the credentials file: written, read back, and upgraded.

An operator belongs to tenants (``tenants=main-st,elm-st``) or to every tenant
(``tenants=*``). A line written before tenants existed still signs in, but its operator
decides nothing until `users tenants` gives them some, and every read of such a file says so
in one line. Nobody becomes global by being left out.
"""

from __future__ import annotations

import argparse
import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from loguru import logger

from pipecat_actions.console.command import run_users
from pipecat_actions.console.users import Credentials, UsersFileError, hash_password


@pytest.fixture
def warnings() -> Iterator[list[str]]:
    said: list[str] = []
    sink = logger.add(lambda message: said.append(message.record["message"]), level="WARNING")
    yield said
    logger.remove(sink)


def test_an_operators_tenants_are_written_on_their_line_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "users"
    Credentials(path).add("manager:rosa", "pw", frozenset({"billing"}), ["main-st", "elm-st"])
    Credentials(path).add("sam", "pw", tenants=["*", "main-st"])
    lines = path.read_text().splitlines()
    again = Credentials(path).operators()
    assert lines[1].startswith("manager:rosa:billing:tenants=elm-st,main-st:$argon2id$")
    assert lines[2].startswith("sam::tenants=*:$argon2id$")
    assert again["manager:rosa"].tenants == {"main-st", "elm-st"}
    assert again["manager:rosa"].approver().tenants == {"main-st", "elm-st"}
    assert again["sam"].approver().every_tenant


def test_a_line_from_before_tenants_signs_in_but_decides_nothing_and_is_named_once(
    tmp_path: Path, warnings: list[str]
) -> None:
    path = tmp_path / "users"
    path.write_text(
        f"rosa:manager:{hash_password('pw')}\nsam::tenants=main-st:{hash_password('x')}\n"
    )
    path.chmod(0o600)
    credentials = Credentials(path)
    rosa = credentials.authenticate("rosa", "pw")
    credentials.operators()  # unchanged: not read again, not said again
    assert rosa is not None and rosa.tenants is None
    assert rosa.approver().tenants == frozenset()
    (said,) = warnings
    assert f"credentials file {path}: rosa declares no tenant and may decide nothing" in said
    assert "pipecat-actions users tenants NAME --tenant TENANT (or --all-tenants)" in said
    assert "sam" not in said


def test_setting_tenants_keeps_the_password_and_the_roles(tmp_path: Path) -> None:
    path = tmp_path / "users"
    path.write_text(f"rosa:manager:{hash_password('pw')}\n")
    path.chmod(0o600)
    Credentials(path).set_tenants("ROSA", ["elm-st"])
    rosa = Credentials(path).authenticate("rosa", "pw")
    assert rosa is not None
    assert (rosa.roles, rosa.tenants) == ({"manager"}, {"elm-st"})


def test_a_new_password_keeps_the_tenants_unless_new_ones_are_given(tmp_path: Path) -> None:
    credentials = Credentials(tmp_path / "users")
    credentials.add("rosa", "one", tenants=["elm-st"])
    assert credentials.add("rosa", "two").tenants == {"elm-st"}
    assert credentials.add("rosa", "three", tenants=["main-st"]).tenants == {"main-st"}
    assert credentials.add("sam", "x").tenants is None  # a new one without: decides nothing


@pytest.mark.parametrize(
    ("tenants", "problem"),
    [
        ("", "name at least one tenant"),
        (" , ", "name at least one tenant"),
        ("main st", "is not a tenant"),
        ("[/x]", "is not a tenant"),
    ],
)
def test_a_malformed_tenants_field_is_named_by_its_line(
    tmp_path: Path, tenants: str, problem: str
) -> None:
    path = tmp_path / "users"
    path.write_text(f"rosa:manager:tenants={tenants}:{hash_password('pw')}\n")
    path.chmod(0o600)
    with pytest.raises(UsersFileError, match=rf"users, line 1: .*{problem}"):
        Credentials(path).operators()


def test_a_tenant_holding_a_colon_is_refused_so_the_line_reads_back_the_same(
    tmp_path: Path,
) -> None:
    with pytest.raises(UsersFileError, match="a tenant may not hold ':'"):
        Credentials(tmp_path / "users").add("rosa", "pw", tenants=["main:st"])


def _users(path: Path, command: str, name: str, *tenants: str, every: bool = False) -> str:
    args = argparse.Namespace(
        users=str(path),
        users_command=command,
        name=name,
        role=[],
        tenant=list(tenants),
        all_tenants=every,
        password_stdin=True,
    )
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("sys.stdin", io.StringIO("pw\n"))
        assert run_users(args, out) == 0
    return out.getvalue()


def test_users_add_asks_which_tenants_a_new_operator_decides_in(tmp_path: Path) -> None:
    path = tmp_path / "users"
    with pytest.raises(UsersFileError, match=r"--tenant TENANT .* or --all-tenants; nobody is"):
        _users(path, "add", "rosa")
    assert not path.exists()
    assert "rosa (no role; tenants: every tenant)" in _users(path, "add", "rosa", every=True)
    assert "tenants: every tenant" in _users(path, "add", "rosa")  # a new password only
    with pytest.raises(UsersFileError, match="not both"):
        _users(path, "add", "rosa", "elm-st", every=True)


def test_users_tenants_upgrades_a_line_from_before_tenants(tmp_path: Path) -> None:
    path = tmp_path / "users"
    path.write_text(f"rosa:manager:{hash_password('pw')}\n")
    path.chmod(0o600)
    said = _users(path, "tenants", "rosa", "main-st", "elm-st")
    assert "rosa (manager; tenants: elm-st, main-st)" in said
    assert Credentials(path).authenticate("rosa", "pw") is not None
    with pytest.raises(UsersFileError, match="nobody is not in"):
        _users(path, "tenants", "nobody", "main-st")
