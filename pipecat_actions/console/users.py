"""The operators' credentials file: who may sign in to the console and decide from the CLI.

One line per operator, ``NAME:ROLES:tenants=TENANTS:HASH``, where ROLES is a comma-separated
list (possibly empty), TENANTS the comma-separated tenants whose operations they may decide on
(``*`` for every tenant), and HASH is the password's Argon2id hash (RFC 9106) in the PHC
string format, with its parameters and salt (``$argon2id$v=19$m=19456,t=2,p=1$SALT$KEY``),
made and checked by argon2-cffi. Lines starting with ``#`` and blank lines are ignored. A
password is never stored, and the file is written readable by its owner only::

    # pipecat-actions users add rosa --role manager --tenant main-st --users ops/users
    rosa:manager:tenants=main-st:$argon2id$v=19$m=19456,t=2,p=1$0d3…$Yx…

The parameters are OWASP's for Argon2id (19 MiB, two passes, one lane): about the cost of the
scrypt hashes (RFC 7914, ``scrypt$N$r$p$SALT$KEY``) that files written before hold. Those
still sign in, and are replaced by an Argon2id hash of the same password at that sign-in, as
is a hash made with other parameters than these.

A line written before operators had tenants (``NAME:ROLES:HASH``) still signs in, but its
operator belongs to no tenant and decides on nothing until ``pipecat-actions users tenants
NAME --tenant T`` (or ``--all-tenants``) gives them some; each read of such a file logs one
line naming them.

Names and roles follow `pipecat_actions.policy.fields.check_approver_name`, so a name in the
file is the name a policy's ``confirmation.approvers`` lists, and a role its
``approver_roles``; a tenant is written the same way (without ``:``), as the sessions of the
bot name it. The file is read again whenever it changes: removing a line signs the operator
out of the console at their next request.
"""

from __future__ import annotations

__all__ = [
    "Credentials",
    "Operator",
    "UsersFileError",
    "check_tenants",
    "hash_password",
    "needs_rehash",
    "verify_password",
]

import base64
import contextlib
import functools
import hashlib
import hmac
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import argon2
from loguru import logger

from pipecat_actions.approvals import ALL_TENANTS, Approver
from pipecat_actions.errors import UsersFileError
from pipecat_actions.policy.fields import check_approver_name

_HASHER = argon2.PasswordHasher(time_cost=2, memory_cost=19456, parallelism=1)
"""OWASP's Argon2id parameters (Password Storage Cheat Sheet): 19 MiB, 2 passes, 1 lane."""
_ARGON2 = "$argon2id$"
_SCRYPT = "scrypt$"
"""The hashes files written before this release hold: checked, and replaced at a sign-in."""
_MAX_PASSWORD = 1024
_MAX_FILE_BYTES = 1_000_000


_TENANTS = "tenants="
"""What starts the tenants field of a line (a role never holds ``=``, so no older line does)."""


@dataclass(frozen=True, slots=True)
class Operator:
    """One line of the credentials file.

    Attributes:
        name: Their name.
        roles: Their roles.
        password_hash: Their password's hash (Argon2id; scrypt in an older file).
        tenants: The tenants they decide in (``*``: every one); None for a line written
            before operators had tenants: they decide in none.
    """

    name: str
    roles: frozenset[str]
    password_hash: str
    tenants: frozenset[str] | None = None

    def approver(self, via: str = "credentials file") -> Approver:
        """The operator as an `Approver` (their name, roles and tenants), signed in ``via``."""
        return Approver(self.name, self.roles, self.tenants or frozenset(), via)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def hash_password(password: str, *, salt: bytes | None = None) -> str:
    """Return ``password``'s Argon2id hash as the credentials file stores it."""
    if not password:
        raise UsersFileError("a password must not be empty")
    if len(password) > _MAX_PASSWORD:
        raise UsersFileError(f"a password is at most {_MAX_PASSWORD} characters")
    return _HASHER.hash(password, salt=salt)


def verify_password(password: str, stored: str) -> bool:
    """Whether ``password`` matches ``stored`` (Argon2id, or an older file's scrypt hash)."""
    if stored.startswith(_ARGON2):
        if len(password) > _MAX_PASSWORD:
            return False  # never one of theirs (hash_password refuses it); not worth hashing
        try:
            return _HASHER.verify(stored, password)
        except (argon2.exceptions.VerificationError, argon2.exceptions.InvalidHashError):
            return False  # a mismatch is a VerificationError too
    return stored.startswith(_SCRYPT) and _verify_scrypt(password, stored)


def needs_rehash(stored: str) -> bool:
    """Whether ``stored`` should be replaced by a hash of these parameters at a sign-in."""
    return not stored.startswith(_ARGON2) or _HASHER.check_needs_rehash(stored)


def _verify_scrypt(password: str, stored: str) -> bool:
    """An older file's ``scrypt$N$r$p$SALT$KEY`` (base64) hash, compared in constant time."""
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


@functools.cache
def _dummy_hash() -> str:
    """What an unknown name's password is checked against, so that it takes as long."""
    return hash_password("not a password", salt=b"\0" * 16)


def _check_role(role: str) -> str:
    # The file separates fields with ':', so a role holding one would read back as another
    # name and role than the ones written.
    check_approver_name(role)
    if ":" in role:
        raise ValueError(f"{role!r} is not a role name: a role may not hold ':'")
    return role


def _check_tenant(tenant: str) -> str:
    if tenant == ALL_TENANTS:
        return tenant
    try:
        check_approver_name(tenant)
    except ValueError:
        raise ValueError(
            f"{tenant!r} is not a tenant: use at most 128 letters, digits and . _ @ + -, "
            "starting with a letter or digit, or * for every tenant"
        ) from None
    if ":" in tenant:
        raise ValueError(f"{tenant!r} is not a tenant: a tenant may not hold ':'")
    return tenant


def check_tenants(tenants: Iterable[str]) -> frozenset[str]:
    """Return ``tenants`` checked, as a set (``{"*"}`` when ``*`` is among them).

    Raises:
        UsersFileError: A malformed tenant, or none at all.
    """
    try:
        checked = frozenset(_check_tenant(t.strip()) for t in tenants if t.strip())
    except ValueError as exc:
        raise UsersFileError(str(exc)) from None
    if not checked:
        raise UsersFileError("name at least one tenant, or * for every tenant")
    return frozenset({ALL_TENANTS}) if ALL_TENANTS in checked else checked


def _parse(text: str, path: Path) -> dict[str, Operator]:
    found: dict[str, Operator] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(":")
        where = f"{path}, line {number}"
        if len(parts) < 3:
            raise UsersFileError(
                f"{where}: write NAME:ROLES:tenants=TENANTS:HASH (see `pipecat-actions users`)"
            )
        # A name may hold ':' (manager:rosa), a role list, the tenants and a hash never do.
        tenants_text: str | None = None
        if len(parts) >= 4 and parts[-2].startswith(_TENANTS):
            tenants_text = parts[-2].removeprefix(_TENANTS)
            parts = [*parts[:-2], parts[-1]]
        name, roles_text, password_hash = ":".join(parts[:-2]), parts[-2], parts[-1]
        try:
            check_approver_name(name)
            roles = frozenset(
                _check_role(role.strip()) for role in roles_text.split(",") if role.strip()
            )
            tenants = None if tenants_text is None else check_tenants(tenants_text.split(","))
        except (ValueError, UsersFileError) as exc:
            raise UsersFileError(f"{where}: {exc}") from None
        if not password_hash.startswith((_ARGON2, _SCRYPT)):
            raise UsersFileError(
                f"{where}: the password hash is not an Argon2id (or older scrypt) hash"
            )
        if name.casefold() in (n.casefold() for n in found):
            raise UsersFileError(f"{where}: {name} is listed twice")
        found[name] = Operator(name=name, roles=roles, password_hash=password_hash, tenants=tenants)
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
            self._warn_undeclared()
        return self._operators

    def _warn_undeclared(self) -> None:
        """One line naming the operators of an older file, who decide in no tenant yet."""
        undeclared = [op.name for op in self._operators.values() if op.tenants is None]
        if undeclared:
            logger.warning(
                "credentials file {}: {} declare{} no tenant and may decide nothing until "
                "given some: pipecat-actions users tenants NAME --tenant TENANT "
                "(or --all-tenants) --users {}",
                self.path,
                ", ".join(undeclared),
                "s" if len(undeclared) == 1 else "",
                self.path,
            )

    def find(self, name: str) -> Operator | None:
        """The operator named ``name`` (any case), or None."""
        wanted = name.casefold()
        return next((op for op in self.operators().values() if op.name.casefold() == wanted), None)

    def authenticate(self, name: str, password: str) -> Operator | None:
        """The operator if ``password`` is theirs, else None (as slow for an unknown name).

        An older hash of theirs (scrypt, or other parameters) is replaced in the file by one
        of this release's: the password is at hand only now. A file that cannot be written
        keeps the older hash, which still signs in (one warning line).
        """
        operator = self.find(name) if name else None
        stored = operator.password_hash if operator else _dummy_hash()
        if not verify_password(password, stored) or operator is None:
            return None
        if needs_rehash(stored):
            operator = self._rehash(operator, password)
        return operator

    def _rehash(self, operator: Operator, password: str) -> Operator:
        existing = self.operators()
        if existing.get(operator.name) != operator:
            return operator  # the file changed meanwhile: leave it to the next sign-in
        updated = replace(operator, password_hash=hash_password(password))
        try:
            self._write({**existing, operator.name: updated})
        except UsersFileError as exc:
            logger.warning("{}: {}'s older hash is kept: {}", self.path, operator.name, exc)
            return operator
        return updated

    def add(
        self,
        name: str,
        password: str,
        roles: frozenset[str] = frozenset(),
        tenants: Iterable[str] | None = None,
    ) -> Operator:
        """Add ``name`` (or replace their password and roles); write the file 0600.

        Args:
            name: The operator's name.
            password: Their password (only its hash is written).
            roles: Their roles.
            tenants: The tenants they decide in (``*``: every one); None keeps an existing
                operator's, and gives a new one none (they decide on nothing).

        Raises:
            UsersFileError: A malformed name, role or tenant, or the file cannot be written.
        """
        try:
            check_approver_name(name)
            for role in roles:
                _check_role(role)
        except ValueError as exc:
            raise UsersFileError(str(exc)) from None
        checked = None if tenants is None else check_tenants(tenants)
        existing = self.operators() if self.path.exists() else {}
        before = next((op for n, op in existing.items() if n.casefold() == name.casefold()), None)
        operator = Operator(
            name=name,
            roles=frozenset(roles),
            password_hash=hash_password(password),
            tenants=checked if tenants is not None or before is None else before.tenants,
        )
        kept = {n: op for n, op in existing.items() if n.casefold() != name.casefold()}
        kept[name] = operator
        self._write(kept)
        return operator

    def set_tenants(self, name: str, tenants: Iterable[str]) -> Operator:
        """Give ``name`` the ``tenants`` they decide in (``*``: every one); keep the rest.

        Raises:
            UsersFileError: ``name`` is not listed, a tenant is malformed, or the file cannot
                be written.
        """
        checked = check_tenants(tenants)
        existing = self.operators()
        found = next((n for n in existing if n.casefold() == name.casefold()), None)
        if found is None:
            raise UsersFileError(f"{name} is not in {self.path}")
        operator = Operator(
            name=found,
            roles=existing[found].roles,
            password_hash=existing[found].password_hash,
            tenants=checked,
        )
        self._write({**existing, found: operator})
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
        lines = [
            "# pipecat-actions operators: NAME:ROLES:tenants=TENANTS:HASH "
            "(see `pipecat-actions users`)"
        ]
        for op in operators.values():
            tenants = "" if op.tenants is None else f"{_TENANTS}{','.join(sorted(op.tenants))}:"
            lines.append(f"{op.name}:{','.join(sorted(op.roles))}:{tenants}{op.password_hash}")
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
