"""Why a ledger could not be opened, in one line that says what to check.

An operator who points a command at the wrong place gets the driver's words otherwise
(``ConnectionRefusedError: [Errno 111] Connect call failed``, ``unable to open database
file``), or worse, a hint to create a ledger in a database that is someone else's. Here each
cause is named with where it was met (the file, or PostgreSQL's host and port; a password is
never shown) and what to check:

* what is there is not a ledger (a directory, a file that is not a SQLite database, a
  database with tables but none of the ledger's): check the URL; nothing suggests creating a
  ledger there (`not_a_ledger`, `other_tables`);
* a SQLite file or folder this user may not read or write: its owner and mode
  (`sqlite_denied`);
* PostgreSQL that cannot be reached, that refuses the user or has no such database: the
  server, the host and port, the user and password, the database name
  (`postgres_unreachable`).
"""

from __future__ import annotations

__all__ = [
    "CHECK_FILE",
    "in_directory",
    "is_denied",
    "not_a_ledger",
    "other_tables",
    "postgres_unreachable",
    "sqlite_denied",
]

import errno
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipecat_actions.errors import (
    LedgerConfigurationError,
    LedgerNotFound,
    LedgerUnavailable,
)

CHECK_FILE = "check that the ledger URL names the ledger's file"
_CHECK_DATABASE = "check that the ledger URL names the ledger's database"


def not_a_ledger(path: Path, why: str, *, hint: str = CHECK_FILE) -> LedgerNotFound:
    """The refusal of a file that holds no ledger: ``why`` in brackets, then what to check."""
    return LedgerNotFound(f"{path} is not a pipecat_actions ledger ({why}): {hint}", path=str(path))


def in_directory(path: Path) -> str:
    """What to check when the ledger's path is a directory."""
    return f"name the ledger's file, not its folder (e.g. {path / 'ledger.db'})"


def other_tables(where: str, tables: Sequence[str], *, sqlite: bool) -> LedgerNotFound:
    """The refusal of a database that holds tables, none of them the ledger's.

    It is someone else's database (or the wrong one): no hint to create a ledger there.

    Args:
        where: The SQLite file, or the database's URL (password hidden).
        tables: Its tables.
        sqlite: Whether it is a SQLite file.
    """
    shown = ", ".join(tables[:3]) + (f" and {len(tables) - 3} more" if len(tables) > 3 else "")
    what = "a SQLite database" if sqlite else "a database"
    return LedgerNotFound(
        f"{where} is not a pipecat_actions ledger ({what} with other tables: {shown}): "
        + (CHECK_FILE if sqlite else _CHECK_DATABASE),
        path=where,
    )


def sqlite_denied(path: Path, exc: OSError, *, doing: str) -> LedgerConfigurationError:
    """The refusal of a SQLite file (or its sidecar) this user may not ``doing`` (read, ...)."""
    why = exc.strerror or str(exc)
    other = exc.filename is not None and Path(exc.filename) != path
    return LedgerConfigurationError(
        f"cannot {doing} the ledger file {path} ({f'{exc.filename}: ' if other else ''}{why}): "
        f"check the owner and mode of the file and its folder (ls -l), or run as a user who "
        f"may {doing} it"
    )


def postgres_unreachable(
    exc: BaseException, url: Any, *, timeout_secs: float
) -> LedgerUnavailable | None:
    """The error to give for ``exc``, met connecting to PostgreSQL at ``url``; None if unknown.

    It is `LedgerUnavailable`, as every failure to reach the database is (a database or a
    user may yet be created: a caller that waits for the database retries), with the words
    that say what to check.

    Args:
        exc: What the driver raised (``__cause__`` of the ledger's `LedgerUnavailable`).
        url: The SQLAlchemy URL of the ledger.
        timeout_secs: The connect timeout it was given.
    """
    import asyncpg

    shown = _shown(url)
    host = url.query.get("host") or url.host
    where = f"{host}:{url.port or 5432}" if host else f"the local server, port {url.port or 5432}"
    url_right = f"that the ledger URL {shown} is right"
    if isinstance(exc, socket.gaierror):
        return LedgerUnavailable(
            f"cannot find the PostgreSQL host {host} ({exc.strerror or exc}): "
            f"check the host name in the ledger URL {shown}"
        )
    if isinstance(exc, ConnectionRefusedError) or (
        isinstance(exc, OSError) and exc.errno == errno.ECONNREFUSED
    ):
        return LedgerUnavailable(
            f"PostgreSQL at {where} refused the connection: check that the server is running "
            f"and listens there, and {url_right}"
        )
    if isinstance(exc, TimeoutError):
        return LedgerUnavailable(
            f"PostgreSQL at {where} did not answer within {timeout_secs:g} s: check that the "
            f"server is running and reachable from here (network, firewall), and {url_right}"
        )
    if isinstance(exc, OSError):
        return LedgerUnavailable(
            f"cannot connect to PostgreSQL at {where} ({exc.strerror or exc}): check that the "
            f"server is running and reachable from here, and {url_right}"
        )
    if isinstance(exc, asyncpg.InvalidCatalogNameError):
        database = url.database or ""
        return LedgerUnavailable(
            f"PostgreSQL at {where} has no database {database!r}: check the database name in "
            f"the ledger URL {shown}; a new ledger needs its database created first "
            f"(createdb {database}), then `pipecat-actions db upgrade --ledger URL`"
        )
    if isinstance(exc, asyncpg.InvalidAuthorizationSpecificationError):
        return LedgerUnavailable(
            f"PostgreSQL at {where} refused the user {url.username or ''!r} ({exc}): check the "
            f"user and password in the ledger URL {shown}, and the server's pg_hba.conf"
        )
    if isinstance(exc, asyncpg.CannotConnectNowError | asyncpg.TooManyConnectionsError):
        return LedgerUnavailable(
            f"PostgreSQL at {where} takes no connection now ({exc}): check the server "
            "(starting, stopping, or every connection slot taken: max_connections)"
        )
    return None


def _shown(url: Any) -> str:
    """``url`` as a person types it: password hidden, no async driver."""
    rendered: str = url.set(drivername=url.get_backend_name()).render_as_string(hide_password=True)
    return rendered


def is_denied(exc: BaseException) -> bool:
    """Whether ``exc`` is the system refusing this user access to a file or a folder."""
    return isinstance(exc, PermissionError) or (
        isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
    )
