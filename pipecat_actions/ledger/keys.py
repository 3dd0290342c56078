"""The keys that seal a policy's sensitive values in the ledger, read from the environment.

Two variables, neither ever written to a file by pipecat_actions nor printed back:

* ``PIPECAT_ACTIONS_LEDGER_KEYS``: Fernet keys (``cryptography``'s authenticated encryption,
  AES-128-CBC with HMAC-SHA256), comma-separated. The first encrypts; every one of them
  decrypts (`cryptography.fernet.MultiFernet`). To rotate: put a new key first and keep the old
  ones after it, restart, run ``pipecat-actions ledger rotate-keys`` (every sealed value is
  re-encrypted with the first key), then drop the old keys.
* ``PIPECAT_ACTIONS_LEDGER_HASH_KEY``: the HMAC-SHA256 key of everything kept as a keyed hash:
  ``sensitive: hash`` values, and the arguments hash and idempotency key of a tool with
  sensitive values (a plain SHA-256 of a card number or a phone number can be reversed by
  trying every one). Equal values give equal hashes only under one key, so this key is not
  rotated: changing it lets a repeat of a call made before the change run again, and turns
  away an approval of an operation admitted before it.

``pipecat-actions ledger new-keys`` prints a fresh value of each.
"""

from __future__ import annotations

__all__ = [
    "ENV_LEDGER_HASH_KEY",
    "ENV_LEDGER_KEYS",
    "LedgerKeys",
    "new_keys",
]

import hashlib
import hmac
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from pipecat_actions.errors import LedgerKeysError

ENV_LEDGER_KEYS = "PIPECAT_ACTIONS_LEDGER_KEYS"
"""Comma-separated Fernet keys: the first encrypts, every one decrypts."""
ENV_LEDGER_HASH_KEY = "PIPECAT_ACTIONS_LEDGER_HASH_KEY"
"""The key of every keyed hash (HMAC-SHA256) the ledger stores."""
MIN_HASH_KEY_CHARS = 32
"""The shortest hash key accepted (``new_keys`` makes one of 43 characters, 256 bits)."""


@dataclass(frozen=True)
class LedgerKeys:
    """The keys of one process, as read from its environment.

    Attributes:
        encryption: Every Fernet key, the one that encrypts first; empty when not configured.
        hash_key: The HMAC key, or None when not configured.
    """

    encryption: tuple[Fernet, ...] = ()
    hash_key: bytes | None = None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> LedgerKeys:
        """Read the keys from ``environ`` (default `os.environ`); a variable may be unset.

        Raises:
            LedgerKeysError: A variable is set but malformed (the message never shows a key).
        """
        env = os.environ if environ is None else environ
        return cls(
            encryption=_fernet_keys(env.get(ENV_LEDGER_KEYS, "")),
            hash_key=_hash_key(env.get(ENV_LEDGER_HASH_KEY, "")),
        )

    @classmethod
    def fresh(cls) -> LedgerKeys:
        """New random keys held in memory only (a throwaway ledger's: a scenario run's)."""
        made = new_keys()
        return cls(
            encryption=_fernet_keys(made[ENV_LEDGER_KEYS]),
            hash_key=_hash_key(made[ENV_LEDGER_HASH_KEY]),
        )

    def require(self, *, encryption: bool, hashing: bool, why: str) -> None:
        """Refuse to go on without the keys ``why`` needs, in one line naming each variable.

        Raises:
            LedgerKeysError: A needed variable is not set.
        """
        missing = [
            name
            for name, needed, there in (
                (ENV_LEDGER_KEYS, encryption, bool(self.encryption)),
                (ENV_LEDGER_HASH_KEY, hashing, self.hash_key is not None),
            )
            if needed and not there
        ]
        if missing:
            raise LedgerKeysError(
                f"{why}, but {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not "
                "set: nothing is stored in plain text instead (make keys with "
                "`pipecat-actions ledger new-keys`)"
            )

    @property
    def can_encrypt(self) -> bool:
        """Whether a Fernet key is configured."""
        return bool(self.encryption)

    def encrypt(self, data: bytes) -> str:
        """Encrypt ``data`` with the first key; return the Fernet token as text."""
        return self._multi().encrypt(data).decode("ascii")

    def decrypt(self, token: str) -> bytes:
        """Decrypt a token made with any of the keys.

        Raises:
            InvalidToken: The token is damaged, not a token, or made with another key.
        """
        return self._multi().decrypt(token.encode("ascii"))

    def is_current(self, token: str) -> bool:
        """Whether ``token`` was made with the first key (rotation leaves it as it is)."""
        try:
            self.encryption[0].decrypt(token.encode("ascii"))
        except (InvalidToken, IndexError, UnicodeEncodeError):
            return False
        return True

    def rotate(self, token: str) -> str:
        """Re-encrypt ``token`` with the first key, keeping what it holds.

        Raises:
            InvalidToken: No key decrypts it.
        """
        return self._multi().rotate(token.encode("ascii")).decode("ascii")

    def digest(self, data: bytes) -> str:
        """The HMAC-SHA256 of ``data`` under the hash key, as 64 hex characters.

        Raises:
            LedgerKeysError: No hash key is configured.
        """
        if self.hash_key is None:
            raise LedgerKeysError(f"{ENV_LEDGER_HASH_KEY} is not set")
        return hmac.new(self.hash_key, data, hashlib.sha256).hexdigest()

    def _multi(self) -> MultiFernet:
        if not self.encryption:
            raise LedgerKeysError(f"{ENV_LEDGER_KEYS} is not set")
        return MultiFernet(list(self.encryption))


def _fernet_keys(text: str) -> tuple[Fernet, ...]:
    if not text.strip():
        return ()
    parts = [part.strip() for part in text.split(",")]
    keys: list[Fernet] = []
    for number, part in enumerate(parts, start=1):
        try:
            keys.append(Fernet(part.encode("ascii")))
        except (ValueError, UnicodeEncodeError):
            raise LedgerKeysError(
                f"{ENV_LEDGER_KEYS}: key {number} of {len(parts)} is not a Fernet key (32 "
                "url-safe base64-encoded bytes, as `pipecat-actions ledger new-keys` prints)"
            ) from None
    return tuple(keys)


def _hash_key(text: str) -> bytes | None:
    if not text:
        return None
    if len(text.strip()) < MIN_HASH_KEY_CHARS:
        raise LedgerKeysError(
            f"{ENV_LEDGER_HASH_KEY} is too short: give at least {MIN_HASH_KEY_CHARS} random "
            "characters (as `pipecat-actions ledger new-keys` prints)"
        )
    return text.strip().encode("utf-8")


def new_keys() -> dict[str, str]:
    """Fresh values of both variables, for a new deployment or a rotation's new first key."""
    return {
        ENV_LEDGER_KEYS: Fernet.generate_key().decode("ascii"),
        ENV_LEDGER_HASH_KEY: secrets.token_urlsafe(32),
    }
