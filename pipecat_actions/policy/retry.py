"""When and how often a failed call is tried again: a value object with a pure backoff formula.

Shaped like Temporal's ``RetryPolicy``: attempts count the first call, the backoff grows by a
multiplier up to a cap, and jitter spreads simultaneous retries apart. Whether a retry is *safe*
is not decided here but on the tool policy (a mutation retries only when the system of record
honours our idempotency key).
"""

from __future__ import annotations

__all__ = ["RetryPolicy"]

from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pipecat_actions.clock import backoff_secs
from pipecat_actions.policy._violations import Violation, raise_violations


class RetryPolicy(BaseModel):
    """How many times a failed call is tried, and how long to wait between tries.

    The wait before retry ``n`` (``n = 1`` is the first retry) is
    ``min(initial_backoff_secs * multiplier ** (n - 1), max_backoff_secs)``, spread by
    ``± jitter`` of itself; see `delay_for`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    max_attempts: int = Field(
        default=1,
        ge=1,
        description=(
            "How many times the call may be made in total, the first call included. "
            "1 means never retry. A mutation may retry only when idempotency.provider_dedupes "
            "is true."
        ),
    )
    initial_backoff_secs: float = Field(
        default=0.5,
        ge=0,
        description="Seconds to wait before the first retry.",
    )
    multiplier: float = Field(
        default=2.0,
        ge=1,
        description=(
            "How much longer each wait is than the one before (2.0 doubles it; 1.0 keeps it "
            "constant)."
        ),
    )
    max_backoff_secs: float = Field(
        default=10.0,
        ge=0,
        description=(
            "The longest wait between two tries, in seconds, before jitter; at least "
            "initial_backoff_secs."
        ),
    )
    jitter: float = Field(
        default=0.2,
        ge=0,
        le=1,
        description=(
            "How much each wait is randomly spread, as a fraction of it (0.2 means up to 20% "
            "shorter or longer), so that many callers do not retry at the same instant."
        ),
    )

    @model_validator(mode="after")
    def _check_backoff_bounds(self) -> Self:
        if self.max_backoff_secs < self.initial_backoff_secs:
            raise_violations(
                [
                    Violation(
                        ("max_backoff_secs",),
                        f"must be at least initial_backoff_secs ({self.initial_backoff_secs:g}), "
                        f"got {self.max_backoff_secs:g}",
                    )
                ]
            )
        return self

    @property
    def retries(self) -> int:
        """How many retries may follow the first call (``max_attempts - 1``)."""
        return self.max_attempts - 1

    def delay_for(self, attempt: int, *, rand: float = 0.5) -> float:
        """Return the seconds to wait before retry number ``attempt``.

        This is a pure function: the caller supplies the randomness, so tests and replays get
        the same delays.

        Args:
            attempt: 1 for the first retry (the second call), 2 for the next, and so on.
            rand: A number in ``[0, 1]``, usually ``random.random()``. 0.5 gives the backoff
                without jitter; 0 gives it shortened by ``jitter``, values towards 1 lengthen
                it by up to ``jitter``.

        Returns:
            A delay in seconds, never negative and never above
            ``max_backoff_secs * (1 + jitter)``.

        Raises:
            ValueError: ``attempt`` is below 1 or ``rand`` is outside ``[0, 1]``.
        """
        if attempt < 1:
            raise ValueError(f"attempt counts retries from 1, got {attempt}")
        if not 0.0 <= rand <= 1.0:
            raise ValueError(f"rand must be within [0, 1], got {rand}")
        backoff = backoff_secs(
            self.initial_backoff_secs, self.multiplier, self.max_backoff_secs, attempt
        )
        spread = backoff * (1.0 + self.jitter * (2.0 * rand - 1.0))
        return min(max(spread, 0.0), self.max_backoff_secs * (1.0 + self.jitter))
