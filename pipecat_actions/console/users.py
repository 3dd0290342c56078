"""The operators' credentials file: who may sign in to the console and decide from the CLI.

One line per operator, ``NAME:ROLES:HASH``, where ROLES is a comma-separated list (possibly
empty) and HASH is the password's scrypt key (RFC 7914, Python's `hashlib.scrypt`) with its
parameters and salt, ``scrypt$N$r$p$SALT$KEY`` (base64). Lines starting with ``#`` and blank
lines are ignored. A password is never stored, and the file is written readable by its owner
only::

    # pipecat-actions users add rosa --role manager --users ops/users
    rosa:manager:scrypt$16384$8$1$0d3…$Yx…

Names and roles follow `pipecat_actions.policy.fields.check_approver_name`, so a name in the
file is the name a policy's ``confirmation.approvers`` lists, and a role its
``approver_roles``. The file is read again whenever it changes: removing a line signs the
operator out of the console at their next request.
"""

from __future__ import annotations

__all__ = ["Credentials", "Operator", "UsersFileError", "hash_password", "verify_password"]

import base64
import contextlib
import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from pipecat_actions.approvals import Approver
from pipecat_actions.errors import ConfigurationError
from pipecat_actions.policy.fields import check_approver_name

_N, _R, _P = 2**14, 8, 1
_KEY_BYTES = 32
_MAX_PASSWORD = 1024
_MAX_FILE_BYTES = 1_000_000


class UsersFileError(ConfigurationError):
    """The credentials file cannot be read, or a line of it is malformed."""


@dataclass(frozen=True, slots=True)
class Operator:
    """One line of the credentials file."""

    name: str
    roles: frozenset[str]
    password_hash: str

    def approver(self, via: str = "credentials file") -> Approver:
        """The operator as an `Approver` (their name and roles), signed in ``via``."""
        return Approver(self.name, self.roles, via)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def hash_password(password: str, *, salt: bytes | None = None) -> str:
    """Return ``password``'s scrypt hash as the credentials file stores it."""
    if not password:
        raise UsersFileError("a password must not be empty")
    if len(password) > _MAX_PASSWORD:
        raise UsersFileError(f"a password is at most {_MAX_PASSWORD} characters")
    salt = salt if salt is not None else secrets.token_bytes(16)
    key = hashlib.scrypt(password.encode("utf-8"), salt=salt, n=_N, r=_R, p=_P, dklen=_KEY_BYTES)
    return f"scrypt${_N}${_R}${_P}${_b64(salt)}${_b64(key)}"


def verify_password(password: str, stored: str) -> bool:
    """Whether ``password`` matches ``stored`` (a `hash_password` value), in constant time."""
    try:
        scheme, n, r, p, salt, key = stored.split("$")
        if scheme != "scrypt":
            return False
        n_, r_, p_ = int(n), int(r), int(p)
        if not (2 <= n_ <= 2**20 and 1 <= r_ <= 32 and 1 <= p_ <= 16):
            return False
        expected = base64.b64decode(key, validate=True)
        found = hashlib.scrypt(
            password.encode("utf-8")[: _MAX_PASSWORD * 4],
            salt=base64.b64decode(salt, validate=True),
            n=n_,
            r=r_,
            p=p_,
            dklen=len(expected),
            maxmem=256 * 1024 * 1024,
        )
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(found, expected)


_DUMMY_HASH = hash_password("not a password", salt=b"\0" * 16)


def _check_role(role: str) -> str:
    # The file separates fields with ':', so a role holding one would read back as another
    # name and role than the ones written.
    check_approver_name(role)
    if ":" in role:
        raise ValueError(f"{role!r} is not a role name: a role may not hold ':'")
    return role


def _parse(text: str, path: Path) -> dict[str, Operator]:
    found: dict[str, Operator] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(":")
        where = f"{path}, line {number}"
        if len(parts) < 3:
            raise UsersFileError(f"{where}: write NAME:ROLES:HASH (see `pipecat-actions users`)")
        # A name may hold ':' (manager:rosa), a role list and a hash never do.
        name, roles_text, password_hash = ":".join(parts[:-2]), parts[-2], parts[-1]
        try:
            check_approver_name(name)
            roles = frozenset(
                _check_role(role.strip()) for role in roles_text.split(",") if role.strip()
            )
        except ValueError as exc:
            raise UsersFileError(f"{where}: {exc}") from None
        if not password_hash.startswith("scrypt$"):
            raise UsersFileError(f"{where}: the password hash is not an scrypt hash")
        if name.casefold() in (n.casefold() for n in found):
            raise UsersFileError(f"{where}: {name} is listed twice")
        found[name] = Operator(name=name, roles=roles, password_hash=password_hash)
    return found


class Credentials:
    """The credentials file at ``path``, read again whenever it changes.

    Raises:
        UsersFileError: (on reads) the file is missing, too large or malformed.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._seen: tuple[int, int, int] | None = None
        self._operators: dict[str, Operator] = {}

    def operators(self) -> dict[str, Operator]:
        """Every operator in the file, by name."""
        try:
            info = self.path.stat()
        except OSError as exc:
            raise UsersFileError(
                f"cannot read the credentials file {self.path}: {exc.strerror or exc}; "
                "create it with `pipecat-actions users add NAME --users FILE`"
            ) from None
        if info.st_mode & 0o022:
            raise UsersFileError(
                f"the credentials file {self.path} can be changed by others than its owner "
                f"(mode {info.st_mode & 0o777:o}): anyone who can write it can make approvers; "
                f"chmod 600 {self.path}"
            )
        stamp = (info.st_mtime_ns, info.st_size, info.st_mode)
        if stamp != self._seen:
            if info.st_size > _MAX_FILE_BYTES:
                raise UsersFileError(f"{self.path} is larger than {_MAX_FILE_BYTES} bytes")
            try:
                text = self.path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise UsersFileError(
                    f"cannot read the credentials file {self.path}: {exc}"
                ) from None
            self._operators = _parse(text, self.path)
            self._seen = stamp
        return self._operators

    def find(self, name: str) -> Operator | None:
        """The operator named ``name`` (any case), or None."""
        wanted = name.casefold()
        return next((op for op in self.operators().values() if op.name.casefold() == wanted), None)

    def authenticate(self, name: str, password: str) -> Operator | None:
        """The operator if ``password`` is theirs, else None (as slow for an unknown name)."""
        operator = self.find(name) if name else None
        matched = verify_password(password, operator.password_hash if operator else _DUMMY_HASH)
        return operator if matched and operator is not None else None

    def add(self, name: str, password: str, roles: frozenset[str] = frozenset()) -> Operator:
        """Add ``name`` (or replace their password and roles); write the file 0600.

        Raises:
            UsersFileError: A malformed name or role, or the file cannot be written.
        """
        try:
            check_approver_name(name)
            for role in roles:
                _check_role(role)
        except ValueError as exc:
            raise UsersFileError(str(exc)) from None
        existing = self.operators() if self.path.exists() else {}
        operator = Operator(
            name=name, roles=frozenset(roles), password_hash=hash_password(password)
        )
        kept = {n: op for n, op in existing.items() if n.casefold() != name.casefold()}
        kept[name] = operator
        self._write(kept)
        return operator

    def remove(self, name: str) -> bool:
        """Remove ``name``; return whether they were listed."""
        existing = self.operators()
        kept = {n: op for n, op in existing.items() if n.casefold() != name.casefold()}
        if len(kept) == len(existing):
            return False
        self._write(kept)
        return True

    def _write(self, operators: dict[str, Operator]) -> None:
        lines = ["# pipecat-actions operators: NAME:ROLES:HASH (see `pipecat-actions users`)"]
        lines += [
            f"{op.name}:{','.join(sorted(op.roles))}:{op.password_hash}"
            for op in operators.values()
        ]
        temporary = self.path.with_name(f".{self.path.name}.{secrets.token_hex(4)}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w", encoding="utf-8") as out:
                out.write("\n".join(lines) + "\n")
            os.replace(temporary, self.path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise UsersFileError(f"cannot write {self.path}: {exc.strerror or exc}") from None
        self._seen = None
