"""The operators' credentials file: scrypt hashes, owner-only, names a policy can list."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from pipecat_actions.console.users import (
    Credentials,
    UsersFileError,
    hash_password,
    verify_password,
)


def test_a_password_is_stored_as_a_salted_scrypt_hash_and_checked(tmp_path: Path) -> None:
    credentials = Credentials(tmp_path / "users")
    credentials.add("rosa", "correct horse", frozenset({"manager"}))
    text = (tmp_path / "users").read_text()
    assert "correct horse" not in text
    assert "rosa:manager:scrypt$16384$8$1$" in text
    assert credentials.authenticate("rosa", "correct horse") is not None
    assert credentials.authenticate("ROSA", "correct horse") is not None
    assert credentials.authenticate("rosa", "correct horsE") is None
    assert credentials.authenticate("nobody", "correct horse") is None
    assert hash_password("x") != hash_password("x")  # salted


def test_the_file_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "ops" / "users"
    Credentials(path).add("rosa", "pw")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_changing_a_password_and_removing_an_operator(tmp_path: Path) -> None:
    credentials = Credentials(tmp_path / "users")
    credentials.add("manager:rosa", "one")
    credentials.add("sam", "two")
    credentials.add("Manager:Rosa", "three", frozenset({"billing"}))
    again = Credentials(tmp_path / "users")
    assert sorted(again.operators()) == ["Manager:Rosa", "sam"]
    assert again.authenticate("manager:rosa", "three") is not None
    assert again.authenticate("manager:rosa", "one") is None
    assert again.remove("sam") and not again.remove("sam")
    assert sorted(Credentials(tmp_path / "users").operators()) == ["Manager:Rosa"]


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("rosa", "write NAME:ROLES:tenants=TENANTS:HASH"),
        ("ro sa::scrypt$1$1$1$AA==$AA==", "not an approver name"),
        ("rosa:bad role:scrypt$1$1$1$AA==$AA==", "not an approver name"),
        ("rosa::plain-password", "not an scrypt hash"),
    ],
)
def test_a_malformed_line_is_named_by_its_number(tmp_path: Path, line: str, problem: str) -> None:
    path = tmp_path / "users"
    path.write_text(f"# operators\n\n{line}\n")
    with pytest.raises(UsersFileError, match=rf"users, line 3: .*{problem}"):
        Credentials(path).operators()


def test_a_name_listed_twice_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "users"
    hashed = hash_password("x")
    path.write_text(f"rosa::{hashed}\nROSA::{hashed}\n")
    with pytest.raises(UsersFileError, match="ROSA is listed twice"):
        Credentials(path).operators()


def test_a_missing_file_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(UsersFileError, match="pipecat-actions users add"):
        Credentials(tmp_path / "nope").operators()


@pytest.mark.parametrize(
    "stored",
    ["", "md5$x", "scrypt$a$b$c$d$e", "scrypt$16384$8$1$!!$AA==", "scrypt$99999999$8$1$AA==$AA=="],
)
def test_a_hash_that_is_not_a_valid_scrypt_hash_never_matches(stored: str) -> None:
    assert verify_password("x", stored) is False


def test_a_role_holding_a_colon_is_refused_so_it_cannot_read_back_as_another_name(
    tmp_path: Path,
) -> None:
    with pytest.raises(UsersFileError, match="a role may not hold ':'"):
        Credentials(tmp_path / "users").add("eve", "pw", frozenset({"x:manager"}))
    assert not (tmp_path / "users").exists()
