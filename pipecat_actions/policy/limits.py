"""How many calls of one tool may run, wait, or happen per minute or per conversation."""

from __future__ import annotations

__all__ = ["LimitsPolicy"]

from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, Strict, model_validator

from pipecat_actions.policy._violations import Violation, raise_violations
from pipecat_actions.policy.enums import Overflow
from pipecat_actions.policy.fields import PlainData, number_text


class LimitsPolicy(BaseModel):
    """Backpressure for one tool: caps on concurrency, rate and calls per conversation.

    When a call would go over a cap, `overflow` decides what happens to it. Every cap is
    optional; a tool without caps is only bounded by `session_budget` if that is set.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    max_concurrent: int | None = Field(
        default=None,
        ge=1,
        description=(
            "How many calls of this tool may run at the same time, across all conversations "
            "of this process. Leave out for no cap."
        ),
    )
    max_queued: int = Field(
        default=0,
        ge=0,
        description=(
            "How many calls may wait for a free slot when overflow is queue. Calls beyond this "
            "are refused."
        ),
    )
    per_principal: int | None = Field(
        default=None,
        ge=1,
        description=(
            "How many calls of this tool one user (principal) may have running at the same "
            "time. For a mutation, a further call of the same user (a changed request) is "
            "admitted and waits until the user's earlier one has finished, whatever overflow "
            "says; for a read, overflow applies. Leave out for no per-user cap."
        ),
    )
    rate_per_minute: float | None = Field(
        default=None,
        gt=0,
        description=(
            "The most calls of this tool allowed per minute, on average. Leave out for no rate cap."
        ),
    )
    session_budget: int | None = Field(
        default=None,
        ge=1,
        description=(
            "The most calls of this tool allowed in one conversation. Stops a model that is "
            "stuck in a loop from calling it again and again. Leave out for no budget."
        ),
    )
    overflow: Annotated[Overflow, Strict(False)] = Field(
        default=Overflow.REJECT,
        description=(
            "What happens to a call that would go over a cap: reject (refuse it and say why), "
            "queue (wait for a free slot; needs max_concurrent and max_queued), coalesce (share "
            "the result of an identical call already running; reads only) or degrade (answer "
            "with degrade_result instead)."
        ),
    )
    degrade_result: PlainData | None = Field(
        default=None,
        description=(
            "The result given instead of calling the tool when overflow is degrade, e.g. "
            "{available: unknown, note: 'busy, try again shortly'}. Plain data only."
        ),
    )

    @model_validator(mode="after")
    def _check_overflow_needs(self) -> Self:
        violations: list[Violation] = []
        if self.overflow is Overflow.DEGRADE and self.degrade_result is None:
            violations.append(
                Violation(
                    ("degrade_result",),
                    "overflow: degrade needs a degrade_result to answer with",
                )
            )
        if self.overflow is Overflow.QUEUE:
            if self.max_concurrent is None:
                violations.append(
                    Violation(
                        ("max_concurrent",),
                        "overflow: queue needs max_concurrent, the cap that calls queue behind",
                    )
                )
            if self.max_queued < 1:
                violations.append(
                    Violation(
                        ("max_queued",),
                        "overflow: queue needs max_queued of at least 1 "
                        f"(got {number_text(self.max_queued)}), or no call could ever wait",
                    )
                )
        raise_violations(violations)
        return self
