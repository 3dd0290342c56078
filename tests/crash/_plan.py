"""Crash plans: what one case of the crash-point matrix does, drawn from (crash point, seed).

A plan is plain data (it crosses into the child process as JSON). The seed varies things that
change what the runtime goes through, reproducibly:

* which operations the child proposes (1 to 4 besides the target, over four tools: a booking
  that can be reconciled, one admitted only once the turn settles, a note that cannot be
  reconciled, a refund that needs approval) and how each one's provider behaves (answers,
  refuses, fails before sending and is retried, loses its answer, is slow, never answers);
* how many are proposed at once (1 to 3 per wave) and in which wave the target is;
* the point's own variant (which attempt, which step of a compensation, which reconcile
  probe, what the operator decides about an approval);
* whether the provider honours idempotency keys (and the policy says so and allows retries);
* how the crash is recovered: one fresh runtime or two competing ones, and whether an
  admitted operation that was never sent is run or failed (``recover_unsent``).

Only the setup is reproducible: where the other operations stand at the instant of the kill
depends on timing, which is the point of running several seeds.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any


class Point(StrEnum):
    """Where the child process is SIGKILLed."""

    AFTER_ADMISSION_INSERT = "after_admission_insert"
    """The admission's insert is durable (ADMITTED or RUNNING); nothing was called yet."""
    AFTER_RUNNING_BEFORE_SEND = "after_running_before_send"
    """RUNNING (attempt n) is durable and the effect started; the request was not sent."""
    AFTER_SEND_BEFORE_ANSWER = "after_send_before_answer"
    """The provider received the request; its answer never came."""
    AFTER_PROVIDER_COMMIT = "after_provider_commit_before_committed"
    """The provider committed the side effect; COMMITTED was never written."""
    AFTER_COMMITTED_BEFORE_DELIVERY = "after_committed_before_delivery"
    """COMMITTED is durable; the result never reached the conversation (a real pipeline)."""
    DURING_COMPENSATION = "during_compensation"
    """A committed booking is being reversed (at one of four steps of the compensation)."""
    DURING_RECONCILIATION = "during_reconciliation"
    """An operation whose answer was lost is UNKNOWN and its reconcile probe is running."""
    AWAITING_APPROVAL = "awaiting_approval"
    """A refund waits for an operator's approval."""


TOOLS = ("book", "book_later", "note", "refund")
"""``book``: reconcilable, compensable. ``book_later``: ``admit_when: turn_confirmed``.
``note``: no reconcile hook (its UNKNOWN is escalated). ``refund``: approval by an operator."""

BEHAVIOURS = (
    "ok",
    "slow",
    "hang",
    "not_sent_once",
    "busy_once",
    "rejected",
    "lost_answer",
    "lost_request",
)
"""How the provider treats a non-target operation.

``ok`` answers; ``slow`` answers after a moment; ``hang`` receives the request and never
answers; ``not_sent_once`` is unreachable on the first attempt (nothing sent), fine after;
``busy_once`` receives the first attempt and asks to try again (a retry the policy allows
only when the provider dedupes: the same key then reaches it twice); ``rejected`` refuses for
good; ``lost_answer`` commits and the answer is lost (a timeout); ``lost_request`` times out
without having committed anything.
"""

COMPENSATION_STEPS = ("after_insert", "after_compensating", "before_cancel", "after_cancel")
"""Where a compensation is cut: its operation inserted; the original moved to COMPENSATING;
the hook started but sent nothing; the provider cancelled but the hook never returned."""

APPROVAL_FATES = ("approve_after", "reject_after", "expire", "approve_before")
"""What the operator does: approves or rejects after the restart, never answers (the
request expires), or approves before the kill (the dead owner never ran it)."""


@dataclass(frozen=True)
class OpSpec:
    """One operation the child proposes.

    Attributes:
        ref: Its only argument, unique in the plan: it names the operation everywhere.
        tool: One of `TOOLS`.
        behaviour: One of `BEHAVIOURS`, or ``target`` for the operation that hits the point.
        wave: Operations of one wave are proposed at once; waves one after the other.
    """

    ref: str
    tool: str
    behaviour: str
    wave: int


@dataclass(frozen=True)
class Plan:
    """One case of the matrix (see the module docstring)."""

    point: Point
    seed: int
    dedupes: bool
    ops: list[OpSpec]
    target: str
    variant: str
    recoverers: int
    recover_unsent: str
    pipeline: bool

    @property
    def target_op(self) -> OpSpec:
        """The operation that hits the crash point."""
        return next(op for op in self.ops if op.ref == self.target)

    def waves(self) -> list[list[OpSpec]]:
        """The operations grouped by wave, in order."""
        count = max(op.wave for op in self.ops) + 1
        return [[op for op in self.ops if op.wave == w] for w in range(count)]

    def describe(self) -> str:
        """One line that says what this case did, for failure messages."""
        ops = ", ".join(f"{op.ref}:{op.tool}/{op.behaviour}@w{op.wave}" for op in self.ops)
        return (
            f"variant={self.variant} dedupes={self.dedupes} recoverers={self.recoverers} "
            f"recover_unsent={self.recover_unsent} target={self.target} ops=[{ops}]"
        )

    def to_json(self) -> dict[str, Any]:
        """The plan as JSON data (for the child)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        """Rebuild a plan made by `to_json`."""
        return cls(
            point=Point(data["point"]),
            seed=data["seed"],
            dedupes=data["dedupes"],
            ops=[OpSpec(**op) for op in data["ops"]],
            target=data["target"],
            variant=data["variant"],
            recoverers=data["recoverers"],
            recover_unsent=data["recover_unsent"],
            pipeline=data["pipeline"],
        )


_TARGET_TOOLS: dict[Point, tuple[str, ...]] = {
    Point.AFTER_ADMISSION_INSERT: ("book", "book_later", "note"),
    Point.AFTER_RUNNING_BEFORE_SEND: ("book", "book_later", "note"),
    Point.AFTER_SEND_BEFORE_ANSWER: ("book", "book_later", "note"),
    Point.AFTER_PROVIDER_COMMIT: ("book", "book_later", "note"),
    Point.AFTER_COMMITTED_BEFORE_DELIVERY: ("book", "note"),
    Point.DURING_COMPENSATION: ("book",),
    Point.DURING_RECONCILIATION: ("book", "book_later"),
    Point.AWAITING_APPROVAL: ("refund",),
}


def make_plan(point: Point, seed: int) -> Plan:
    """Draw the plan of ``(point, seed)``; the same arguments always give the same plan."""
    rng = random.Random(f"{point.value}:{seed}")
    pipeline = point is Point.AFTER_COMMITTED_BEFORE_DELIVERY
    dedupes = rng.random() < 0.5
    per_wave = rng.randint(1, 3)
    others = rng.randint(1, 4)
    tool = rng.choice(_TARGET_TOOLS[point])
    variant = _variant(point, rng, dedupes=dedupes, tool=tool)
    # A pipeline's LLM waits for every call of a response before the next one, and no turn
    # settles without a bot that speaks: no hanging calls and no turn_confirmed tool there.
    other_tools = ("book", "note") if pipeline else ("book", "book_later", "note", "refund")
    behaviours = [b for b in BEHAVIOURS if not (pipeline and b == "hang")]
    slots = others + 1
    target_index = rng.randrange(slots)
    if point is Point.DURING_COMPENSATION and rng.random() < 0.5:
        target_index = 0  # the booking to reverse comes first: later waves run meanwhile
    ops: list[OpSpec] = []
    for index in range(slots):
        ref = f"o{index}"
        wave = index // per_wave
        if index == target_index:
            ops.append(OpSpec(ref, tool, "target", wave))
            continue
        other = rng.choice(other_tools)
        behaviour = "ok" if other == "refund" else rng.choice(behaviours)
        ops.append(OpSpec(ref, other, behaviour, wave))
    return Plan(
        point=point,
        seed=seed,
        dedupes=dedupes,
        ops=ops,
        target=f"o{target_index}",
        variant=variant,
        recoverers=rng.choice((1, 2)),
        recover_unsent=rng.choice(("run", "run", "fail")),
        pipeline=pipeline,
    )


def _variant(point: Point, rng: random.Random, *, dedupes: bool, tool: str) -> str:
    if point is Point.AFTER_RUNNING_BEFORE_SEND:
        # A second attempt exists only when the policy allows retries (a deduplicating
        # provider); the first one then failed before sending.
        retries = dedupes and tool != "note"
        return rng.choice(("attempt1", "attempt2")) if retries else "attempt1"
    if point is Point.AFTER_COMMITTED_BEFORE_DELIVERY:
        return rng.choice(("answered", "reconciled")) if tool == "book" else "answered"
    if point is Point.DURING_COMPENSATION:
        return rng.choice(COMPENSATION_STEPS)
    if point is Point.DURING_RECONCILIATION:
        committed = rng.choice(("committed", "not_committed"))
        return f"{committed}:probe{rng.choice((1, 2))}"
    if point is Point.AWAITING_APPROVAL:
        return rng.choice(APPROVAL_FATES)
    return "-"


def seeds(long: bool) -> list[int]:
    """The seeds each point runs: 3 by default, 10 for the long variant."""
    return list(range(10 if long else 3))
