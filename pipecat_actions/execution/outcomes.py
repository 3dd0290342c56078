"""How an effect's failure is classified: it decides between a retry, UNKNOWN and FAILED_FINAL.

An effect may raise these classes itself, which is the most precise. Anything else is mapped:

=================================  ===========================  =============================
exception                          meaning                      status
=================================  ===========================  =============================
`EffectNotSent`,                   the request never left        FAILED_RETRYABLE (retried
``ConnectionRefusedError``,                                      when the policy allows)
``socket.gaierror``
`EffectRetryable`                  received, refused, nothing    FAILED_RETRYABLE
                                   committed, try again later
`EffectOutcomeUnknown`,            may have happened             UNKNOWN (reconciled, never
``TimeoutError``, any other                                      retried blindly)
exception of a mutation
`EffectFailed`                     received and refused for      FAILED_FINAL
                                   good; nothing committed
any other exception of a read      reads change nothing          FAILED_RETRYABLE
=================================  ===========================  =============================
"""

from __future__ import annotations

__all__ = [
    "EffectFailed",
    "EffectNotSent",
    "EffectOutcomeUnknown",
    "EffectRetryable",
    "Outcome",
    "classify",
]

import socket
from enum import StrEnum


class EffectFailed(Exception):
    """The provider received the request and refused it for good; nothing was committed."""


class EffectNotSent(Exception):
    """The request is known not to have reached the provider; retrying is safe."""


class EffectRetryable(Exception):
    """The provider received the request, committed nothing, and says to try again."""


class EffectOutcomeUnknown(Exception):
    """The request may or may not have taken effect (for example a timeout after sending)."""


class Outcome(StrEnum):
    """The classification of a failed attempt."""

    NOT_SENT = "not_sent"
    RETRYABLE = "retryable"
    UNKNOWN = "unknown"
    FINAL = "final"


def classify(exc: BaseException, *, mutation: bool) -> Outcome:
    """Classify the exception an effect raised (see the module docstring)."""
    if isinstance(exc, EffectNotSent | ConnectionRefusedError | socket.gaierror):
        return Outcome.NOT_SENT
    if isinstance(exc, EffectRetryable):
        return Outcome.RETRYABLE
    if isinstance(exc, EffectFailed):
        return Outcome.FINAL
    if isinstance(exc, EffectOutcomeUnknown | TimeoutError):
        return Outcome.UNKNOWN if mutation else Outcome.RETRYABLE
    return Outcome.UNKNOWN if mutation else Outcome.RETRYABLE
