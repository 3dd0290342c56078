"""The operators' credentials file: Argon2id hashes, owner-only, names a policy can list.

Files written before hold scrypt hashes: they still sign in, and are rehashed at that sign-in.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import os
import stat
from pathlib import Path

import pytest

from pipecat_actions.console.users import (
    Credentials,
    UsersFileError,
    hash_password,
    needs_rehash,
    verify_password,
)
from pipecat_actions.testing import capture_logs

ARGON2 = "$argon2id$v=19$m=19456,t=2,p=1$"


def _scrypt_hash(password: str) -> str:
    """A hash as files written before this release hold it (scrypt, N=2**14, r=8, p=1)."""
    salt = b"0123456789abcdef"
    key = hashlib.scrypt(password.encode(), salt=salt, n=2**14, r=8, p=1, dklen=32)
    return f"scrypt$16384$8$1${base64.b64encode(salt).decode()}${base64.b64encode(key).decode()}"


def test_a_password_is_stored_as_a_salted_argon2id_hash_and_checked(tmp_path: Path) -> None:
    credentials = Credentials(tmp_path / "users")
    credentials.add("rosa", "correct horse", frozenset({"manager"}))
    text = (tmp_path / "users").read_text()
    assert "correct horse" not in text
    assert f"rosa:manager:{ARGON2}" in text
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
        ("rosa::plain-password", "not an Argon2id \\(or older scrypt\\) hash"),
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
    [
        "",
        "md5$x",
        "scrypt$a$b$c$d$e",
        "scrypt$16384$8$1$!!$AA==",
        "scrypt$99999999$8$1$AA==$AA==",
        "$argon2id$garbage",
        f"{ARGON2}!!$AA",
        "$argon2i$v=19$m=19456,t=2,p=1$c2FsdHNhbHQ$AAAAAAAAAAAAAAAAAAAAAA",
    ],
)
def test_a_hash_that_is_not_a_valid_hash_never_matches(stored: str) -> None:
    assert verify_password("x", stored) is False


def test_an_older_scrypt_hash_signs_in_and_is_replaced_by_argon2id_at_that_sign_in(
    tmp_path: Path,
) -> None:
    path = tmp_path / "users"
    path.write_text(f"rosa:manager:tenants=main-st:{_scrypt_hash('old pw')}\n")
    path.chmod(0o600)
    credentials = Credentials(path)
    assert credentials.authenticate("rosa", "wrong") is None
    assert "scrypt$" in path.read_text()  # a wrong password changes nothing
    signed_in = credentials.authenticate("rosa", "old pw")
    assert signed_in is not None and signed_in.password_hash.startswith(ARGON2)
    assert signed_in.roles == {"manager"} and signed_in.tenants == {"main-st"}
    [line] = [line for line in path.read_text().splitlines() if not line.startswith("#")]
    assert line.startswith(f"rosa:manager:tenants=main-st:{ARGON2}")
    assert not needs_rehash(signed_in.password_hash)
    assert Credentials(path).authenticate("rosa", "old pw") is not None


def test_a_hash_of_other_parameters_is_rehashed_at_a_sign_in(tmp_path: Path) -> None:
    import argon2

    stronger = argon2.PasswordHasher(time_cost=3, memory_cost=19456, parallelism=1)
    path = tmp_path / "users"
    path.write_text(f"rosa::tenants=*:{stronger.hash('pw')}\n")
    path.chmod(0o600)
    assert needs_rehash(Credentials(path).operators()["rosa"].password_hash)
    assert Credentials(path).authenticate("rosa", "pw") is not None
    assert f"rosa::tenants=*:{ARGON2}" in path.read_text()


def test_a_file_that_cannot_be_written_keeps_the_older_hash_and_still_signs_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "users"
    path.write_text(f"rosa::tenants=*:{_scrypt_hash('pw')}\n")
    path.chmod(0o600)
    credentials = Credentials(path)
    credentials.operators()

    def read_only(*_: object) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))  # as root, no mode stops a write

    with monkeypatch.context() as patched:
        patched.setattr(os, "replace", read_only)
        with capture_logs("WARNING", format="{message}") as lines:
            assert credentials.authenticate("rosa", "pw") is not None
    assert "scrypt$" in path.read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["users"]  # no temporary file left
    [line] = lines
    assert line.startswith(f"{path}: rosa's older hash is kept: cannot write {path}")


def test_a_role_holding_a_colon_is_refused_so_it_cannot_read_back_as_another_name(
    tmp_path: Path,
) -> None:
    with pytest.raises(UsersFileError, match="a role may not hold ':'"):
        Credentials(tmp_path / "users").add("eve", "pw", frozenset({"x:manager"}))
    assert not (tmp_path / "users").exists()
