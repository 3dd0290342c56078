"""Errors raised by pipecat_actions.

Every error derives from `PipecatActionsError` and carries keyword-only context fields and a
`retryable` flag that says whether the same call may succeed if simply tried again::

    PipecatActionsError
    ├── Refused                        a preconditions hook refuses a call (told to the model)
    │   └── LimitExceeded              a limit refuses it: budget, rate, concurrency (`code`)
    ├── ApprovalRefused                a decision cannot be applied: status, tenant, window, ...
    ├── ScenarioError                  a scenario file cannot be run (lists every problem)
    ├── PolicyError                    a policy file is unreadable or invalid (lists every problem)
    ├── StatusError
    │   └── IllegalTransition          from → to is not in the status machine's table
    ├── LedgerError                    the ledger could not do what was asked
    │   ├── LedgerUnavailable          the database could not be reached (retryable)
    │   ├── LedgerConfigurationError   unsafe durability settings, unsupported URL
    │   │   ├── LedgerNotFound         no ledger where one must already exist
    │   │   └── LedgerKeysError        sealing keys missing or malformed
    │   ├── LedgerIntegrityError       the write breaks a constraint (duplicate id, ...)
    │   ├── LedgerLost                 the ledger's file was deleted, replaced or damaged
    │   ├── SchemaVersionMismatch      the database schema is older or newer than this code
    │   ├── OperationNotFound          no operation with that id
    │   ├── IdempotencyMismatch        same idempotency key, different arguments
    │   └── TransitionRefused          a compare-and-set lost
    │       ├── UnexpectedStatus       the operation is no longer in the expected status
    │       └── StaleFence             the caller's lease was taken over by another owner
    └── ConfigurationError             the package was wired together wrongly
        └── UsersFileError             the console's credentials file is unreadable or malformed

Infrastructure failures are wrapped (``raise LedgerUnavailable(...) from exc``); an exception
raised by a tool's own code is never replaced by one of these.
"""

from __future__ import annotations

__all__ = [
    "ApprovalRefused",
    "ConfigurationError",
    "IdempotencyMismatch",
    "IllegalTransition",
    "LedgerConfigurationError",
    "LedgerError",
    "LedgerIntegrityError",
    "LedgerKeysError",
    "LedgerLost",
    "LedgerNotFound",
    "LedgerUnavailable",
    "LimitExceeded",
    "OperationNotFound",
    "PipecatActionsError",
    "PolicyError",
    "PolicyProblem",
    "Refused",
    "ScenarioError",
    "SchemaVersionMismatch",
    "StaleFence",
    "StatusError",
    "TransitionRefused",
    "UnexpectedStatus",
    "UsersFileError",
]

from dataclasses import dataclass


class PipecatActionsError(Exception):
    """Base class of every error raised by pipecat_actions.

    Attributes:
        retryable: True when the same call may succeed if tried again unchanged.
    """

    retryable: bool = False

    def __init__(self, message: str, *, retryable: bool | None = None) -> None:
        super().__init__(message)
        self.message = message
        if retryable is not None:
            self.retryable = retryable


# --- policy --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PolicyProblem:
    """One problem found in a policy file.

    Attributes:
        file: Path of the file, or ``"<string>"`` for a policy given as text.
        key_path: Dotted path of the offending key (``tools.book_table.retry.max_attempts``),
            empty when the problem concerns the whole file.
        reason: What is wrong, in plain words.
    """

    file: str
    key_path: str
    reason: str

    def __str__(self) -> str:
        where = f"{self.file}: {self.key_path}" if self.key_path else self.file
        return f"{where}: {self.reason}"


class PolicyError(PipecatActionsError):
    """A policy file could not be loaded; `problems` lists every problem found."""

    def __init__(self, problems: list[PolicyProblem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems) or "invalid policy")


# --- status machine ------------------------------------------------------------------------------


class StatusError(PipecatActionsError):
    """Base class of status machine errors."""


class IllegalTransition(StatusError):
    """A transition that the status machine does not allow was asked for."""

    def __init__(self, *, operation_id: str | None, from_status: str, to_status: str) -> None:
        self.operation_id = operation_id
        self.from_status = from_status
        self.to_status = to_status
        op = f"operation {operation_id}: " if operation_id else ""
        super().__init__(f"{op}illegal transition {from_status} -> {to_status}")


# --- ledger --------------------------------------------------------------------------------------


class LedgerError(PipecatActionsError):
    """Base class of ledger errors."""


class LedgerUnavailable(LedgerError):
    """The ledger's database could not be reached or failed while writing."""

    retryable = True


class LedgerConfigurationError(LedgerError):
    """The database is set up in a way the ledger refuses (unsafe durability, bad URL)."""


class LedgerNotFound(LedgerConfigurationError):
    """No ledger is where one was asked for with ``must_exist``; nothing was written.

    Either nothing is there, or what is there is not a ledger (a directory, a file that is not
    a SQLite database, a SQLite database without the ledger's tables).

    Attributes:
        path: The SQLite file that is not there, or not a ledger.
    """

    def __init__(self, message: str, *, path: str) -> None:
        self.path = path
        super().__init__(message)


class LedgerKeysError(LedgerConfigurationError):
    """The keys that seal sensitive values are not set, or malformed (see `ledger.keys`).

    Its message names the environment variable, never a key.
    """


class LedgerIntegrityError(LedgerError):
    """The database refused a write that breaks a constraint; retrying it cannot help."""


class LedgerLost(LedgerError):
    """The ledger's records cannot be trusted any more.

    Its SQLite file was deleted, replaced, emptied or damaged. Retrying cannot help; the ledger
    refuses every call from then on.
    """


class SchemaVersionMismatch(LedgerError):
    """The database schema is not the version this code was written for."""

    def __init__(self, *, url: str, found: str | None, expected: str, hint: str) -> None:
        self.url = url
        self.found = found
        self.expected = expected
        super().__init__(
            f"ledger schema at {url} is at revision {found or 'none'}, "
            f"this pipecat_actions needs {expected}: {hint}"
        )


class OperationNotFound(LedgerError):
    """No operation with that id exists in the ledger."""

    def __init__(self, *, operation_id: str) -> None:
        self.operation_id = operation_id
        super().__init__(f"operation {operation_id} not found")


class IdempotencyMismatch(LedgerError):
    """The idempotency key is already bound to an operation with different arguments.

    Nothing was written. The caller reused a key for a different request (Stripe returns 400
    for this; Powertools raises ``IdempotencyValidationError``).
    """

    def __init__(
        self,
        *,
        tenant: str,
        idempotency_key: str,
        operation_id: str,
        expected_args_hash: str,
        given_args_hash: str,
    ) -> None:
        self.tenant = tenant
        self.idempotency_key = idempotency_key
        self.operation_id = operation_id
        self.expected_args_hash = expected_args_hash
        self.given_args_hash = given_args_hash
        super().__init__(
            f"idempotency key {idempotency_key!r} (tenant {tenant!r}) is bound to operation "
            f"{operation_id} with different arguments"
        )


class TransitionRefused(LedgerError):
    """A compare-and-set transition was refused; nothing was written."""

    def __init__(self, message: str, *, operation_id: str, actual_status: str) -> None:
        self.operation_id = operation_id
        self.actual_status = actual_status
        super().__init__(message)


class UnexpectedStatus(TransitionRefused):
    """The operation is not in the status the caller expected (someone else moved it)."""

    def __init__(self, *, operation_id: str, expected_status: str, actual_status: str) -> None:
        self.expected_status = expected_status
        super().__init__(
            f"operation {operation_id} is {actual_status}, not {expected_status}",
            operation_id=operation_id,
            actual_status=actual_status,
        )


class StaleFence(TransitionRefused):
    """The caller's fence is older than the operation's: another owner claimed it."""

    def __init__(
        self, *, operation_id: str, given_fence: int, actual_fence: int, actual_status: str
    ) -> None:
        self.given_fence = given_fence
        self.actual_fence = actual_fence
        super().__init__(
            f"operation {operation_id}: fence {given_fence} is stale (now {actual_fence}); "
            "another owner holds it",
            operation_id=operation_id,
            actual_status=actual_status,
        )


# --- wiring --------------------------------------------------------------------------------------


class ConfigurationError(PipecatActionsError):
    """pipecat_actions was wired together in a way that cannot work."""


class UsersFileError(ConfigurationError):
    """The console's credentials file cannot be read, or a line of it is malformed."""


class Refused(PipecatActionsError):
    """Raised by a preconditions hook to refuse a call; ``message`` is told to the model.

    Args:
        message: A plain-language reason the model can relay to the user.
        code: A short machine-readable reason (``"no_such_booking"``).
    """

    def __init__(self, message: str, *, code: str = "precondition_failed") -> None:
        super().__init__(message)
        self.code = code


class LimitExceeded(Refused):
    """A call was refused by a limit; ``code`` says which."""


class ApprovalRefused(PipecatActionsError):
    """A decision could not be applied: wrong status, tenant, arguments, approver or reason."""


class ScenarioError(PipecatActionsError):
    """A scenario file cannot be run; `problems` lists every problem found (file, key, why)."""

    def __init__(self, problems: list[PolicyProblem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems) or "invalid scenario")
